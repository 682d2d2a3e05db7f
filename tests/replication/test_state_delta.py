"""Which names a cell's delta contains: syntax, fingerprints, sharing, IPython's own names."""

from __future__ import annotations

import contextlib
import pickle
import tempfile
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.interactiveshell import InteractiveShell
from replication_harness import Executor, published

from jupyter_notebookos.kernel.statelog import StateLog
from jupyter_notebookos.replication import fingerprint as fp
from jupyter_notebookos.replication.bindings import cell_bindings
from jupyter_notebookos.replication.config import DEFAULT_BUFFER_THRESHOLD
from jupyter_notebookos.replication.objectstore import ObjectStore
from jupyter_notebookos.replication.records import apply_record
from jupyter_notebookos.replication.state import StateTracker


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("x = 1", {"x"}),
        ("a, (b, *c) = 1, (2, 3)", {"a", "b", "c"}),
        ("x += 1\ny: int = 2", {"x", "y"}),
        ("for i, j in []: pass", {"i", "j"}),
        ("with open('f') as fh, open('g') as (u, v): pass", {"fh", "u", "v"}),
        ("if (n := 3): pass", {"n"}),
        ("[last := z for z in range(3)]", {"last"}),  # walrus leaks out of the comprehension; z does not
        ("import os.path, numpy as np\nfrom a.b import c as d, e", {"os", "np", "d", "e"}),
        ("def f(p=1):\n    q = 2\n    return q", {"f"}),
        ("class K:\n    attr = 1\n    def m(self): pass", {"K"}),
        ("def f():\n    global G, H\n    G = 1\n    local = 2\n    def inner():\n        H2 = 3", {"f", "G"}),
        ("def f():\n    global G\n    del G", {"f", "G"}),
        ("class K:\n    global G\n    G = 1", {"K", "G"}),
        ("del a, b[0]", {"a", "b"}),
        ("obj.attr.deep = 1\nd[k][j] = 2", {"obj", "d"}),
        ("try:\n    pass\nexcept E as err:\n    pass", {"err"}),
        (
            "match p:\n    case [x1, *rest]: pass\n    case {'k': v1, **more}: pass\n    case C(a=y1) as whole: pass",
            {"x1", "rest", "v1", "more", "y1", "whole"},
        ),
        ("lambda q: (w := q)", set()),
        ("print(x)\nlst.append(1)", set()),  # calls: syntax cannot tell; fingerprints do
    ],
)
def test_cell_bindings_finds_every_binding_form(source, expected):
    bindings = cell_bindings(source)
    assert bindings.parsed
    assert set(bindings.touched) == expected


def test_unparsable_cell_still_gets_a_delta_from_fingerprints(executor):
    executor.run("x = 1")
    delta = executor.run("get_ipython().run_cell('x = 2')")  # rebinding the parser cannot see
    assert set(delta.values) == {"x"}


def test_mutation_through_a_helper_marks_every_alias(executor):
    executor.run("def helper(v):\n    v.append(1)\na = b = []\nbox = {'inner': a}\nother = [0]")
    delta = executor.run("helper(b)")
    assert set(delta.values) == {"a", "b", "box"}
    assert delta.why["b"] == "mutated"
    assert "other" not in delta.values and "helper" not in delta.values


def test_attribute_and_item_assignment_are_in_the_delta(executor):
    executor.run("class K: pass\nobj = K()\nd = {}")
    assert set(executor.run("obj.x = 1").values) == {"obj"}
    assert set(executor.run("d['k'] = [1]").values) == {"d"}


def test_rebinding_to_an_existing_object_brings_its_other_names(executor):
    executor.run("a = [1, 2]\nunrelated = [3]")
    delta = executor.run("c = a")
    assert set(delta.values) == {"a", "c"}
    assert delta.why["a"] == "shares an object with c"


def test_what_instances_of_a_notebook_class_share_deep_inside_is_found(executor, replica, monkeypatch):
    """The pickler's way names only the dicts, lists, sets and instances of notebook classes held more than once
    (300,000 instances are 600,000 objects with their __dict__s): sharing deep inside must still be found, and
    objects of library classes (whose memory could be shared without a reference) are named whatever they hold."""
    executor.run(
        "import types\nclass Row:\n    def __init__(self, i):\n        self.i = i\n        self.tags = ['a']\n"
        "rows = [Row(i) for i in range(100)]\nholder = Row(-1)\nholder.link = rows[30]\ntags = rows[40].tags\n"
        "spaces = [types.SimpleNamespace(k=1)]"
    )
    replica.apply(executor.records[-1])
    groups = executor.tracker.groups
    assert groups is not None and {"rows", "holder", "tags"} <= groups["rows"] and "spaces" not in groups["rows"]
    ns, shared = executor.ns, []
    fp.fingerprint(ns["rows"], ns, shared)
    assert {id(ns["rows"]), id(ns["rows"][30]), id(ns["tags"])} <= set(shared)
    assert id(ns["rows"][0]) not in shared and id(ns["rows"][0].__dict__) not in shared
    shared.clear()
    fp.fingerprint(ns["spaces"], ns, shared)
    assert id(ns["spaces"][0]) in shared  # (types.SimpleNamespace: not a notebook class)
    delta = executor.run("tags.append('deep')\nholder.link.i = -30")
    assert {"rows", "holder", "tags"} <= set(delta.values)
    replica.apply(executor.records[-1])
    assert replica.eval("holder.link is rows[30] and tags is rows[40].tags") is True
    assert replica.eval("(rows[30].i, rows[40].tags[-1])") == (-30, "deep")
    # Were an object held twice taken for one its parent alone holds, the sharing would go unseen.
    monkeypatch.setattr(fp, "_MEMO_ONE_PARENT_REFS", 99)
    shared.clear()
    fp.fingerprint(ns["rows"], ns, shared)
    assert shared == [id(ns["rows"])]


def test_ipython_names_and_unchanged_values_are_not_in_the_delta(executor):
    executor.run("import numpy as np\nbig = np.zeros(2 ** 20)\n_private = 1")
    executor.shell.run_cell("1 + 1", store_history=True)
    delta = executor.run("y = 2\ny")
    assert set(delta.values) == {"y"}
    names = set(executor.tracker.user_names())
    assert {"In", "Out", "_", "__", "___", "_i", "_ii", "exit", "quit", "get_ipython"}.isdisjoint(names)
    assert {"big", "np", "_private", "y"} <= names


def test_deleted_names_are_in_the_delta(executor):
    executor.run("a = 1\nb = [2]\nc = 3")
    delta = executor.run("del a\nglobals().pop('b')")
    assert set(delta.deleted) == {"a", "b"}
    assert not delta.values


def test_between_cell_changes_are_caught_by_the_idle_verification_and_sent_with_the_next_delta(executor):
    executor.run("lst = []\nother = {}")
    executor.ns["lst"].append(1)  # as a comm callback or background thread would
    assert executor.tracker.verify()
    delta = executor.run("pass")
    assert set(delta.values) == {"lst"} and delta.why["lst"] == "mutated"
    assert executor.tracker.verify() and executor.run("pass").is_empty()


def test_a_follower_that_becomes_the_executor_fingerprints_only_what_its_first_cell_reaches(executor, store, replica):
    """A follower takes its baseline while idle (StateTracker.prepare) and keeps it with the records it applies, and
    knows what their names share (a record carries every name sharing an object with one its cell changed). The
    first cell it runs as the executor fingerprints only what that cell reaches, and a change through an alias
    still sends every name that shares the object."""
    follower_ns: dict = {}
    follower = StateTracker(follower_ns, defer_min_bytes=executor.threshold)
    assert not follower.has_baseline and follower.prepare() and follower.has_baseline
    executor.run("objs = [{'a': i} for i in range(1000)]\nfirst = objs[0]\nother = [1, 2]")
    executor.run("n = 1")
    for record in executor.encoded:
        follower.apply(record, store)
    for raw in executor.records:
        replica.apply(raw)

    follower.before_cell("first['b'] = 2")
    exec("first['b'] = 2", follower_ns)
    delta = follower.after_cell()
    assert set(delta.values) == {"first", "objs"}
    assert follower.last_scanned == 1  # `first`; objs through what the baseline says it shares
    statelog = StateLog(store, "follower", lineage=follower.lineage)
    replica.apply(published(statelog, delta, executor.threshold).to_bytes())
    assert replica.eval("objs[0] is first and first == {'a': 0, 'b': 2} and len(objs) == 1000 and other == [1, 2]")

    # Stopped before it finished, it keeps nothing (and the first cell takes the baseline itself).
    stopped = StateTracker(dict(follower_ns), defer_min_bytes=executor.threshold)
    abort = threading.Event()
    abort.set()
    assert not stopped.prepare(abort) and not stopped.has_baseline


def test_a_new_large_array_is_checksummed_after_the_reply_and_later_changes_are_still_seen(shell, store):
    executor = Executor(shell, store, write_tracking=False)  # the fallback method; tracking: test_change_detection
    delta = executor.run("import numpy as np\nbig = np.zeros(2 ** 20)\nsmall = np.zeros(100)")
    assert set(delta.values) == {"np", "big", "small"}
    # The 8 MiB array goes out of band: no pass over its memory before the reply; the small one is done.
    assert executor.tracker._baseline["big"].pending is not None
    assert executor.tracker._baseline["small"].pending is None
    executor.tracker.settle()  # the replica does this after the reply, before it uploads the buffer
    assert executor.tracker._baseline["big"].pending is None
    assert "big" not in executor.run("pass").values  # unchanged: same checksum as a full fingerprint
    executor.ns["big"][7] = 1.0  # in-place changes between cells
    executor.ns["small"][7] = 1.0
    # A buffer that only its checksum can check is checked by every capture; the rest of what no cell reached,
    # by the idle verification.
    assert executor.run("pass").why == {"big": "mutated"}
    assert executor.tracker.verify()
    assert executor.run("pass").why == {"small": "mutated"}


# -- the rule, as a property ------------------------------------------------------------------------------

NAMES = ["v0", "v1", "v2", "v3"]


def _ops(*templates: str) -> st.SearchStrategy[tuple[str, str, str]]:
    """Cell code templates ({0}, {1}: two names, drawn from NAMES), one drawn at a time."""
    return st.one_of(*(st.tuples(st.just(t), st.sampled_from(NAMES), st.sampled_from(NAMES)) for t in templates))


_op = _ops("{0} = []", "{0} = {1}", "{0} = [{1}]", "{0}.append(len({0}))", "grow({0})", "del {0}")


def _sharing(ns: dict, names: list[str]) -> set[tuple[str, str]]:
    """Pairs of names that reach a common list or Box, or arrays over common memory."""

    def reach(v, out):
        if (isinstance(v, list) or type(v).__name__ == "Box") and id(v) not in out:
            out.add(id(v))
            for item in v if isinstance(v, list) else vars(v).values():
                reach(item, out)
        elif isinstance(v, np.ndarray) and v.size:  # (an empty view shares nothing a write could reach)
            while isinstance(v.base, np.ndarray):
                v = v.base
            out.add(id(v))
        return out

    sets = {n: reach(ns[n], set()) for n in names if n in ns}
    return {(a, b) for a in sets for b in sets if a < b and sets[a] & sets[b]}


def _shape(value: object, seen: dict[int, int] | None = None) -> object:
    """A comparable picture of a value made of lists, Boxes (the notebook class below), arrays and atoms, with the
    objects it holds twice (or in a cycle) as references to where they were first met."""
    seen = {} if seen is None else seen
    if id(value) in seen:
        return ("again", seen[id(value)])
    if not (isinstance(value, list | np.ndarray) or type(value).__name__ == "Box"):
        return pickle.dumps(value)
    seen[id(value)] = len(seen)
    if isinstance(value, np.ndarray):
        return pickle.dumps(value)
    if isinstance(value, list):
        return [_shape(item, seen) for item in value]
    return ("Box", sorted((key, _shape(item, seen)) for key, item in vars(value).items()))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_op, min_size=1, max_size=12))
def test_delta_rule_keeps_a_replica_equal_including_sharing(ops):
    shell = InteractiveShell.instance()
    shell.colors = "NoColor"  # failing cells format tracebacks: no terminal styles to compute
    ns = shell.user_ns
    for name in [*NAMES, "grow"]:  # not shell.reset(), whose gc.collect() took most of this test's time
        ns.pop(name, None)
    with tempfile.TemporaryDirectory() as tmp:
        store = ObjectStore(f"file://{tmp}")
        statelog = StateLog(store, "executor")
        tracker = StateTracker(ns, hidden=shell.user_ns_hidden, transform=shell.transform_cell)
        replica: dict = {}
        for template, target, source in [("def grow(o):\n    o.append(0)", "", ""), *ops]:
            code = template.format(target, source)
            before = {n: pickle.dumps(ns[n]) for n in NAMES if n in ns}
            tracker.before_cell(code)
            shell.run_cell(code, silent=True)  # a failing cell (NameError...) still gets its delta
            delta = tracker.after_cell()
            changed = {n for n in NAMES if n in ns and before.get(n) != pickle.dumps(ns[n])}
            gone = {n for n in before if n not in ns}
            assert changed <= set(delta.values), code
            assert gone <= set(delta.deleted), code
            apply_record(published(statelog, delta, DEFAULT_BUFFER_THRESHOLD).to_bytes(), replica, store)
            present = [n for n in NAMES if n in ns]
            assert {n: ns[n] for n in present} == {n: replica[n] for n in present if n in replica}
            assert [n for n in NAMES if n in replica] == present
            assert _sharing(ns, present) == _sharing(replica, present), code
    for name in [*NAMES, "grow"]:
        ns.pop(name, None)


def _take_turns(turns: list, start: dict, setup: str = "def grow(o):\n    o.append(0)") -> None:
    """Two replicas over namespaces that begin as ``start``, each running the cells of the turns that name it (after
    ``setup``, on the first) and applying the other's records; after every cell both hold equal values, sharing
    alike."""
    with tempfile.TemporaryDirectory() as tmp:
        store = ObjectStore(f"file://{tmp}")
        statelog = StateLog(store, "executor")
        spaces: dict[str, dict] = {"a": dict(start), "b": dict(start)}
        trackers = {key: StateTracker(ns) for key, ns in spaces.items()}
        for tracker in trackers.values():
            assert tracker.prepare()
        for who, (template, target, source) in [("a", (setup, "", "")), *turns]:
            code = template.format(target, source)
            ns, other = spaces[who], spaces["b" if who == "a" else "a"]
            trackers[who].before_cell(code)
            with contextlib.suppress(Exception):  # a failing cell (NameError...) still gets its delta
                exec(code, ns)
            record = published(statelog, trackers[who].after_cell(), DEFAULT_BUFFER_THRESHOLD)
            trackers["b" if who == "a" else "a"].apply(record, store)
            present = [n for n in NAMES if n in ns]
            assert [n for n in NAMES if n in other] == present, code
            assert {n: _shape(ns[n]) for n in present} == {n: _shape(other[n]) for n in present}, code
            assert _sharing(ns, present) == _sharing(other, present), code


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from("ab"), _op), min_size=1, max_size=14))
def test_replicas_taking_turns_as_the_executor_stay_equal_including_sharing(turns):
    """Two replicas, each running some of the cells (the executor changes often, as when GPUs are contended) and
    applying the other's records. A replica that applies a record keeps its baseline, knowing what the record's
    names share without fingerprinting them again in its next cell: aliases must survive every hand-over."""
    _take_turns(turns, {})


_array_op = _ops("{0} = np.zeros(4)", "{0} = {1}[1:]", "{0}[0] += 1", "{0} = [{1}]", "grow({0})", "del {0}")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from("ab"), _array_op), min_size=1, max_size=12))
def test_replicas_taking_turns_keep_views_of_arrays_as_views(turns):
    """As above, with numpy arrays and views of them: a view and its base stay one memory on both replicas."""
    _take_turns(turns, {"np": np})


_object_op = _ops(
    "{0} = Box()", "{0} = Box({1})", "{0} = {1}", "{0}.item = {1}", "touch({0})", "{0} = [{1}]", "del {0}"
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from("ab"), _object_op), min_size=1, max_size=12))
def test_replicas_taking_turns_keep_instances_of_a_notebook_class_shared(turns):
    """As above, with instances of a class the notebook defines, which the pickler's way fingerprints naming only
    those held more than once (fingerprint.py, _shared_ids)."""
    setup = (
        "class Box:\n    def __init__(self, item=None):\n        self.item = item\n"
        "def touch(o):\n    o.n = getattr(o, 'n', 0) + 1"
    )
    _take_turns(turns, {"__name__": "__main__"}, setup)
