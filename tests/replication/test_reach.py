"""A capture fingerprints what the cell can reach; the idle verification catches what reached the rest anyway."""

from __future__ import annotations

import sys
import threading
import types

import pytest
from IPython.core.inputtransformer2 import TransformerManager
from replication_harness import Executor

from jupyter_notebookos.replication.fingerprint import FingerprintAborted, fingerprint, referents_reach
from jupyter_notebookos.replication.reach import cell_reach, code_reach

_transform = TransformerManager().transform_cell


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ("x = 1", {"x"}),
        ("f(a)\nb.append(c)", {"f", "a", "b", "c"}),
        ("def h():\n    return k\n", {"k"}),
        ("%time y = f(x)", {"y", "f", "x"}),
        ("%timeit -n 10 g(z)", {"n", "g", "z"}),  # options read as names: only more names
        ("%%time\nq.append(1)\n", {"q"}),
        ("%matplotlib inline\nplt.plot(a)", {"plt", "a"}),
        ("!ls {path}", set()),
        ("files = !ls", {"files"}),
        ("lst?", set()),
        ("%who", set()),
        ("model.eval()\nout = model.exec_batch(x)", {"model", "out", "x"}),  # attributes named like builtins
    ],
)
def test_the_names_a_cell_reaches(cell, expected):
    reach = cell_reach(_transform(cell))
    assert reach is not None and reach - {"get_ipython"} == expected


@pytest.mark.parametrize(
    "cell",
    [
        "globals()['x'].append(1)",
        "vars()['x']",
        "locals()['x']",
        "eval('x.append(1)')",
        "exec('x = 2')",
        "import sys\nsys._getframe().f_globals['x']",
        "__import__('__main__').x",
        "get_ipython().user_ns['x']",
        "%run script.py",
        "%store -r x",
        "def f():\n    return globals()\n",
        "import sys\nsys.modules['__main__'].x",
        "def f():\n    return sys.modules['__main__']\n",
        "x = (",  # does not parse
    ],
)
def test_a_cell_that_can_reach_any_name_says_so(cell):
    assert cell_reach(_transform(cell)) is None


SETUP = (
    "import numpy as np\n"
    "data = [{'k': i} for i in range(1000)]\n"
    "untouched = {'a': [1, 2, 3]}\n"
    "arr = np.arange(100.0)\n"
    "view = arr[10:20]\n"
    "def grow(n):\n    data.append({'k': n})\n"
    "class Model:\n"
    "    def step(self):\n        untouched['a'].append(4)\n"
    "model = Model()\n"
    "hooks = [lambda: data.append('hooked')]\n"
)


@pytest.fixture
def notebook(executor: Executor) -> Executor:
    executor.run(SETUP)
    assert executor.tracker.verify()
    assert executor.run("pass").is_empty()
    return executor


def test_a_cell_that_reaches_nothing_fingerprints_nothing(notebook):
    assert notebook.run("pass").is_empty()
    assert notebook.tracker.last_scanned == 0
    assert notebook.run("y = 1 + 1").why == {"y": "new"}
    assert notebook.tracker.last_scanned == 1


@pytest.mark.parametrize(
    ("cell", "changed"),
    [
        ("data.append(1)", {"data"}),
        ("grow(5)", {"data"}),  # a function defined in an earlier cell
        ("model.step()", {"untouched"}),  # a method of a notebook class
        ("for h in hooks:\n    h()", {"data", "h", "hooks"}),  # a lambda inside a list (h is new, and hooks holds it)
        ("view[0] = -1.0", {"arr", "view"}),  # a view and its base: one object
        ("arr[15] = -2.0", {"arr", "view"}),
        ("globals()['untouched']['b'] = 1", {"untouched"}),  # can reach any name: everything is fingerprinted
        ("%time grow(6)", {"data"}),
    ],
)
def test_a_change_through_whatever_the_cell_reaches_is_in_its_delta(notebook, cell, changed):
    delta = notebook.run(cell)
    assert set(delta.values) == changed, delta.why
    assert notebook.tracker.last_scanned < 10 or "globals" in cell


def test_the_names_a_notebook_function_reaches_come_from_its_bytecode():
    namespace: dict = {}
    exec(
        "def train(model, xs):\n"
        "    model.eval()\n"  # an attribute named like a builtin: not dynamic
        "    for x in xs:\n"
        "        history.append(loss_fn(model(x)))\n"
        "    def inner():\n        return config\n"
        "    return inner\n"
        "def peek():\n    import sys\n    return sys._getframe().f_back.f_globals\n",
        namespace,
    )
    assert code_reach(namespace["train"].__code__) == {"history", "loss_fn", "config"}
    assert code_reach(namespace["peek"].__code__) is None


def test_an_unpicklable_value_reaches_the_notebook_code_it_holds(notebook):
    notebook.run("import threading\nworker = threading.Thread(target=grow, args=(7,))")
    delta = notebook.run("worker.start()\nworker.join()")
    assert delta.why == {"data": "mutated"}
    assert "worker" not in delta.values  # unpicklable, unchanged as far as anything can tell
    lock_holder = types.SimpleNamespace(lock=threading.Lock(), fn=lambda: None)
    assert referents_reach(lock_holder, notebook.ns) == frozenset()


def test_generators_and_cached_functions_reach_what_their_code_mentions(notebook):
    notebook.run(
        "import functools\n"
        "@functools.lru_cache\ndef cached(n):\n    data.append(n)\n    return n\n"
        "def produce():\n    while True:\n        untouched['a'].append(0)\n        yield\n"
        "gen = produce()"
    )
    assert set(notebook.run("cached(3)").values) == {"data"}
    assert set(notebook.run("next(gen)").values) == {"untouched"}  # (gen cannot be pickled)


def test_what_a_library_changes_through_its_own_reference_is_caught_by_the_idle_verification(notebook, monkeypatch):
    library = types.ModuleType("some_library")
    exec("cache = []\ndef remember(x):\n    cache.append(x)\n", library.__dict__)
    monkeypatch.setitem(sys.modules, "some_library", library)
    notebook.run("import some_library\nmine = some_library.cache")
    delta = notebook.run("some_library.remember(1)")  # the cell does not mention `mine`
    assert "mine" not in delta.values
    assert notebook.tracker.verify() and notebook.tracker.found == ["mine"]
    delta = notebook.run("pass")
    assert delta.why == {"mine": "mutated"}
    assert notebook.run("pass").is_empty()


def test_the_idle_verification_stops_when_asked_and_goes_on_later(notebook):
    notebook.ns["data"].append("between cells")
    abort = threading.Event()
    abort.set()
    assert not notebook.tracker.verify(abort)
    assert notebook.tracker.unverified > 0
    assert notebook.tracker.verify()
    assert notebook.tracker.unverified == 0
    assert notebook.run("pass").why == {"data": "mutated"}


def test_fingerprinting_stops_at_the_next_object_once_aborted(notebook):
    abort = threading.Event()
    abort.set()
    with pytest.raises(FingerprintAborted):
        fingerprint(notebook.ns["data"], notebook.ns, abort=abort)


def test_values_that_records_changed_are_fingerprinted_by_the_next_capture(executor, replica):
    executor.run("shared = [1]\na = {'x': shared}")
    replica.apply(executor.records[-1])
    executor.run("b = a['x']")  # b shares the list with a
    replica.apply(executor.records[-1])
    assert replica.eval("b is a['x']")
    executor.run("b.append(2)")  # reaches b only; a shares the object, so it goes too
    assert set(executor.deltas[-1].values) == {"a", "b", "shared"}
    replica.apply(executor.records[-1])
    assert replica.eval("a['x'] is b and b == [1, 2]")
