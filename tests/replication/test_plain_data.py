"""Plain data (builtin containers of builtin atoms, exact types) is fingerprinted with ``marshal`` instead of the
records' pickler (fingerprint.py): every change to it must still be seen and replicated, and what it shares with
other names still found, or followers would hold stale values."""

from __future__ import annotations

import threading

import pytest

from jupyter_notebookos.replication import fingerprint as fp

SETUP = (
    "objs = [{'i': i, 'tags': ['a', 'b'], 'pos': (i, -0.0), 'raw': b'x'} for i in range(2000)]\n"
    "flags = {1, 2, 3}\nother = [1, 2]"
)

FORMS = {
    "a dict in the list": ("objs", "objs[5]['i'] = -1"),
    "a list in a dict in the list": ("objs", "objs[7]['tags'].append('c')"),
    "through a function": ("objs", "def f(o):\n    o[9]['tags'][0] = 'z'\nf(objs)"),
    "a key added": ("objs", "objs[4]['new'] = None"),
    "a set": ("flags", "flags.add(4)"),
    "an int made an equal bool": ("objs", "objs[1]['i'] = True"),
    "a float's sign": ("objs", "objs[11]['pos'] = (11, 0.0)"),
    "a tuple made a list": ("objs", "objs[13]['pos'] = list(objs[13]['pos'])"),
    "bytes made str": ("objs", "objs[15]['raw'] = 'x'"),
    "bytes made a bytearray": ("objs", "objs[17]['raw'] = bytearray(b'x')"),
    "a thread during the cell": (
        "objs",
        "import threading\nt = threading.Thread(target=lambda: objs[19].update(i=0.5))\nt.start()\nt.join()",
    ),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_every_change_to_plain_data_is_detected_and_replicated(executor, replica, form):
    executor.run(SETUP)
    replica.apply(executor.records[-1])
    name, code = FORMS[form]
    before = repr(executor.ns[name])
    delta = executor.run(code)
    assert repr(executor.ns[name]) != before, "the form did not change the value"
    assert delta.why.get(name) == "mutated"
    assert "other" not in delta.values
    replica.apply(executor.records[-1])
    assert replica.eval(f"repr({name})") == repr(executor.ns[name])


def test_what_plain_data_shares_with_another_name_stays_shared_on_the_followers(executor, replica):
    executor.run(SETUP)
    replica.apply(executor.records[-1])
    # An equal copy in place of an element: the same content, other objects.
    assert executor.run("objs[1] = dict(objs[1])\nobjs[2] = list(objs[2].items())").why.get("objs") == "mutated"
    replica.apply(executor.records[-1])
    for code in ("objs[3] = dict(objs[3])", "first = objs[3]", "first['i'] = -7", "first['tags'].append('t')"):
        executor.run(code)
        replica.apply(executor.records[-1])
    assert executor.tracker.groups is not None and "objs" in executor.tracker.groups["first"]
    assert replica.eval("objs[3] is first") is True
    assert replica.eval("repr(objs[3])") == repr(executor.ns["objs"][3])


def test_what_plain_data_shares_deep_inside_or_with_other_objects_is_found(executor, replica):
    """Only containers held more than once are named for sharing (the million dicts of a list that alone holds them
    are not): sharing deep inside a value, with an object of a class, and within one value must still be found."""
    executor.run(
        SETUP + "\nclass Box:\n    pass\nbox = Box()\nbox.row = objs[30]\ntags = objs[40]['tags']\n"
        "twice = [[0]]\ntwice.append(twice[0])"
    )
    replica.apply(executor.records[-1])
    groups = executor.tracker.groups
    assert groups is not None and {"objs", "box", "tags"} <= groups["objs"] and "twice" not in groups["objs"]
    delta = executor.run("tags.append('deep')\nbox.row['i'] = -30\ntwice[1].append(1)")
    assert {"objs", "box", "tags", "twice"} <= set(delta.values)
    replica.apply(executor.records[-1])
    assert replica.eval("box.row is objs[30] and tags is objs[40]['tags'] and twice[0] is twice[1]") is True
    assert replica.eval("(objs[30]['i'], objs[40]['tags'][-1], twice[0])") == (-30, "deep", [0, 1])


def test_plain_data_holding_itself_is_fingerprinted_and_replicated(executor, replica):
    executor.run("cyc = [1, {'k': 2}]\ncyc.append(cyc)\ncyc[1]['back'] = cyc")
    replica.apply(executor.records[-1])
    assert executor.run("cyc[1]['k'] = 3").why.get("cyc") == "mutated"
    replica.apply(executor.records[-1])
    assert replica.eval("cyc[2] is cyc and cyc[1]['back'] is cyc and cyc[1]['k']") == 3


def test_only_plain_data_skips_the_pickler(monkeypatch):
    """The plain path is taken for builtin containers of builtin atoms, and only for them: a bytearray (which marshal
    writes as bytes), a subclass of a builtin, or any other object sends the value the pickler's way."""
    picked: list[object] = []
    real = fp._Pickler.dump

    def dump(self, obj):
        picked.append(obj)
        return real(self, obj)

    monkeypatch.setattr(fp._Pickler, "dump", dump)
    ns: dict[str, object] = {}
    plain = [{"a": (1, 2.5, None, "s", b"b", 1j, frozenset({3}), {4})}, [True, []]]
    shared: list[int] = []
    first = fp.fingerprint(plain, ns, shared)
    assert picked == []
    # The containers only their parent holds cannot be shared with anything: only the value itself is named.
    assert shared == [id(plain)]
    alias = plain[1][1]  # now held twice: it counts (and marshal marks it, so the digest differs: see there)
    shared.clear()
    fp.fingerprint(plain, ns, shared)
    assert set(shared) == {id(plain), id(alias)}
    del alias
    assert fp.fingerprint(plain, ns) == first
    plain[1][1].append(0)
    assert not fp.fingerprint(plain, ns).same_as(first)

    class Sub(dict):
        pass

    for other in ([bytearray(b"x")], [Sub()], [threading.Lock], [range(3)], {"k": [object()]}):
        picked.clear()
        fp.fingerprint(other, ns)
        assert picked == [other], other


def test_a_verification_of_plain_data_stops_when_asked():
    """The idle verification fingerprints in a thread that a request stops (its abort event): the plain path
    checks it too."""
    stop = threading.Event()
    stop.set()
    with pytest.raises(fp.FingerprintAborted):
        fp.fingerprint([{"a": [1]} for _ in range(10)], {}, abort=stop)
