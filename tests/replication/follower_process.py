"""A replica's namespace in its own process: applies records sent on stdin, answers probes.

Protocol: frames of a 4-byte big-endian length and a pickle of ``(command, argument)``; the answer is a frame
with ``("ok", result)`` or ``("error", text)``. Commands: apply, restore, eval, describe.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
import traceback
from typing import Any


def _frame(out: Any, obj: Any) -> None:
    data = pickle.dumps(obj)
    out.write(struct.pack(">I", len(data)) + data)
    out.flush()


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever user code prints must not corrupt the frames
    inp = sys.stdin.buffer

    import nsprobe
    from IPython.core.interactiveshell import InteractiveShell

    from jupyter_notebookos.replication.chunks import BufferLineage
    from jupyter_notebookos.replication.objectstore import ObjectStore
    from jupyter_notebookos.replication.records import apply_record
    from jupyter_notebookos.replication.writetrack import open_write_tracker

    store = ObjectStore(sys.argv[1])
    lineage = BufferLineage(open_write_tracker()[0])  # patched buffers apply to the memory held here
    shell = InteractiveShell.instance()
    ns = shell.user_ns
    while True:
        head = inp.read(4)
        if len(head) < 4:
            return
        command, arg = pickle.loads(inp.read(struct.unpack(">I", head)[0]))
        try:
            if command == "apply":
                result: Any = list(apply_record(arg, ns, store, lineage).bound)
            elif command == "restore":
                parts, records = arg  # a checkpoint's parts and the log records after it, as a new replica starts
                for record in [*parts, *records]:
                    apply_record(record, ns, store, lineage)
                result = None
            elif command == "eval":
                result = eval(arg, ns)
            elif command == "describe":
                result = nsprobe.describe(ns, shell.user_ns_hidden)
            else:
                raise ValueError(command)
            _frame(proto_out, ("ok", result))
        except Exception as exc:
            _frame(proto_out, ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


if __name__ == "__main__":
    main()
