"""A varied notebook runs on an executor; each cell's record is applied by a replica in another process.

Afterwards the replica's namespace must equal the executor's: values, numpy arrays, aliasing (also across
cells), notebook classes and closures that behave the same.
"""

from __future__ import annotations

import nsprobe
import pytest

NOTEBOOK = [
    "import numpy as np\nimport collections, math as m\nfrom functools import reduce as fold",
    "x, (y, *zs) = 1, (2, 3, 4)\na = b = []",
    "for i in range(3):\n    last_sq = i * i",
    "import contextlib\nwith contextlib.nullcontext([7, 8]) as ctx_val:\n    pass",
    "if (w := 10) > 5:\n    firsts = [found := n for n in range(5) if n > 2]",
    "b.append(1)",
    "registry = {}\ndef add_item(k, v):\n    registry[k] = v",
    "add_item('one', 1)",
    "def set_global():\n    global g\n    g = 42\nset_global()",
    "class Point:\n    dims = 2\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n"
    "    def norm(self):\n        return (self.x ** 2 + self.y ** 2) ** 0.5\n"
    "class Sub(Point):\n    def norm(self):\n        return super().norm() * 2\np = Point(3, 4)\ns = Sub(3, 4)",
    "p.x = 6",
    "d = {'k': [1]}\nd['inst'] = p",
    "def make_counter():\n    c = [0]\n    def inc():\n        c[0] += 1\n        return c[0]\n    return inc\n"
    "counter = make_counter()\ncounter()",
    "small = np.arange(10)\nbig = np.ones(2 ** 18)",
    "def scale(arr):\n    arr *= 2\nholder = [big]",
    "scale(big)",
    "c = a",
    "alias_of_item = d['k']",
    "alias_of_item.append(2)",
    "del small",
    "try:\n    1 / 0\nexcept ZeroDivisionError as err:\n    caught = str(err)",
    "match (1, 2):\n    case (q, r):\n        pass",
    "lst = [1]\ndef helper():\n    lst.append(2)",
    "helper()",
    "Point.dims = 3",
    "q2 = Point(1, 1)",
    "k = 5\nfk = lambda v: v + k",
    "k = 6",
    "%time tm = 3",
    "counts = collections.Counter('abca')\ntotal = fold(lambda u, v: u + v, [1, 2, 3])",
]

PROBES = [
    "a is b is c",
    "a",
    "d['inst'] is p",
    "d['k'] is alias_of_item",
    "holder[0] is big",
    "float(big[0])",
    "isinstance(q2, Point) and isinstance(s, Point)",
    "type(q2) is type(p)",
    "(p.norm(), s.norm(), q2.norm(), Point.dims)",
    "counter()",
    "fk(1)",
    "(g, x, y, zs, i, last_sq, ctx_val, w, firsts, found, q, r, tm, total)",
    "'small' in globals() or 'err' in globals()",
    "registry",
    "lst",
    "m.sqrt(16)",
    "big.flags.writeable",
]


@pytest.mark.slow
def test_replica_namespace_equals_executor_after_a_varied_notebook(executor, replica):
    for cell in NOTEBOOK:
        executor.run(cell)
        replica.apply(executor.records[-1])

    mine = nsprobe.describe(executor.ns, executor.shell.user_ns_hidden)
    theirs = replica.describe()
    assert theirs["values"] == mine["values"]
    assert theirs["shared"] == mine["shared"]
    # Sharing that must survive: same-cell alias, cross-cell alias, instance inside a dict, array in a list.
    assert ("a", "b", "c") in mine["shared"]
    assert ("alias_of_item", "d") in mine["shared"]
    assert ("big", "holder") in mine["shared"]
    for probe in PROBES:
        assert replica.eval(probe) == eval(probe, executor.ns), probe


@pytest.mark.slow
def test_large_array_goes_by_pointer_and_arrives_intact(executor, replica):
    delta = executor.run("import numpy as np\nbig = np.arange(2 ** 20, dtype=np.float64)\nsmall = np.arange(8)")
    record = executor.encoded[-1]
    assert set(delta.values) >= {"big", "small"}
    assert len(record.buffers) == 1 and record.buffers[0].size == 8 * 2**20
    assert len(executor.records[-1]) < 4096  # 8 MiB of data, a pointer of a few dozen bytes
    replica.apply(executor.records[-1])
    assert replica.eval("float(big.sum()), big.dtype.str, big.flags.writeable, small.tolist()") == (
        float(sum(range(2**20))),
        "<f8",
        True,
        list(range(8)),
    )
    # Mutating the big array in place is seen (fingerprint), and the replica gets the new content.
    executor.run("big[3] = -1.0")
    replica.apply(executor.records[-1])
    assert replica.eval("float(big[3])") == -1.0
