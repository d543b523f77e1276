"""TensorBoard reads nabla's event files: runs tests/prof/peer_tb.c (argv[1])
to write scalars into a fresh log directory, then reads them back with
TensorBoard's own EventAccumulator and record reader (which checks every CRC)
and compares the file name, file version, tags, steps, values and wall times
with what the writer says it wrote. Run by ctest through scripts/py-peer.sh
in the venv that scripts/peers.sh makes."""
import os
import shutil
import subprocess
import sys
import tempfile
import time


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def run_writer(writer, logdir):
    out = subprocess.run([writer, logdir], capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"{writer} exited {out.returncode}: {out.stderr.strip()}")
    expected, path = {}, None
    for line in out.stdout.splitlines():
        kind, *rest = line.split(" ")
        if kind == "scalar":
            tag, step, value = rest
            expected.setdefault(tag, []).append((int(step), float(value)))
        elif kind == "path":
            path = " ".join(rest)
    if not path or not expected:
        fail(f"writer printed no path or no scalars:\n{out.stdout[:500]}")
    return expected, path


def main():
    if len(sys.argv) != 2:
        print("usage: peer_tb.py PEER_TB_WRITER", file=sys.stderr)
        return 2
    try:
        import numpy as np
        from tensorboard.backend.event_processing import event_accumulator, io_wrapper
        from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow
    except ImportError as e:
        fail(f"tensorboard is not importable ({e}); run scripts/peers.sh to make the test venv")

    logdir = tempfile.mkdtemp(prefix="nabla_prof_peer_")
    try:
        t0 = time.time()
        expected, path = run_writer(sys.argv[1], logdir)
        t1 = time.time()

        # TensorBoard finds the file by its name
        if os.path.dirname(path) != logdir or not io_wrapper.IsTensorFlowEventsFile(path):
            fail(f"TensorBoard does not take {path} for an event file in {logdir}")
        if list(io_wrapper.GetLogdirSubdirectories(logdir)) != [logdir]:
            fail("TensorBoard finds no run in the log directory")

        # every record passes the reader's length and data CRC checks
        n_records = sum(len(v) for v in expected.values()) + 1
        reader = pywrap_tensorflow.PyRecordReader_New(path.encode())
        got = 0
        while True:
            try:
                reader.GetNext()
            except errors.OutOfRangeError:
                break
            got += 1
        if got != n_records:
            fail(f"record reader read {got} records, the writer wrote {n_records}")

        acc = event_accumulator.EventAccumulator(logdir, size_guidance={event_accumulator.SCALARS: 0})
        acc.Reload()
        if acc.file_version != 2.0:
            fail(f"file_version {acc.file_version}, wanted 2 (brain.Event:2)")
        tags = sorted(acc.Tags()["scalars"])
        if tags != sorted(expected):
            fail(f"tags {tags}, wanted {sorted(expected)}")
        for tag, want in expected.items():
            events = acc.Scalars(tag)
            steps = [e.step for e in events]
            if steps != [s for s, _ in want]:
                fail(f"{tag}: steps {steps[:8]}..., wanted {[s for s, _ in want][:8]}...")
            for e, (step, value) in zip(events, want):
                if e.value != float(np.float32(value)):  # simple_value is a float32: exact after rounding
                    fail(f"{tag} step {step}: value {e.value!r}, wanted float32({value!r})")
                if not t0 - 1 <= e.wall_time <= t1 + 1:
                    fail(f"{tag} step {step}: wall_time {e.wall_time} outside [{t0}, {t1}]")
        print(f"ok: {len(tags)} tags, {n_records - 1} scalars read back by tensorboard "
              f"{__import__('tensorboard').__version__} from {os.path.basename(path)}")

        # and the peer is not a rubber stamp: one flipped data byte is a CRC error
        data = bytearray(open(path, "rb").read())
        data[-6] ^= 1
        bad = os.path.join(logdir, "corrupt")
        open(bad, "wb").write(bytes(data))
        reader = pywrap_tensorflow.PyRecordReader_New(bad.encode())
        try:
            for _ in range(n_records):
                reader.GetNext()
            fail("a corrupted record passed TensorBoard's CRC check")
        except errors.DataLossError:
            pass
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
