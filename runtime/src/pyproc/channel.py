# Put ahead of every helper script by runtime/src/pyproc.rs: the helper's side of the JSON-lines
# protocol. `protocol_sender()` moves the process's stdout onto stderr (so the user's prints
# cannot break the protocol) and returns `send(obj)`, which writes one JSON object per line on
# the real stdout.
def protocol_sender(**dumps_kwargs):
    import json
    import os
    import sys

    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(obj):
        proto.write(json.dumps(obj, **dumps_kwargs) + "\n")
        proto.flush()

    return send


