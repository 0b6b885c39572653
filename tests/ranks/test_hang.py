"""What the ranks' flight records and stacks say when a job stops (distributed.hang): the call a rank waited in,
the ranks that never reached it, and where a stopped rank was. NCCL's records are written here as its watchdog
writes them on a timeout (the pickled flight record, calls marked completed as they retire); gloo's come from
real ranks in test_collective and below, through `roofline profile`."""

import os
import pickle
import re
import subprocess
import sys
import sysconfig
import textwrap
import time

import pytest

from roofline.distributed import hang

pytestmark = pytest.mark.long   # processes of their own: run first (conftest)


def _entry(seq, kind, state, line, group=("0", "default_pg"), numel=4096, **extra):
    return {"collective_seq_id": seq, "p2p_seq_id": 0, "profiling_name": f"nccl:{kind}", "process_group": group,
            "time_created_ns": seq * 1000, "input_sizes": [[numel]], "input_dtypes": ["BFloat16"],
            "output_sizes": [[numel]], "output_dtypes": ["BFloat16"], "state": state, "timeout_ms": 600000,
            "is_p2p": False, "frames": [{"filename": "/x/site-packages/torch/distributed/distributed_c10d.py",
                                         "line": 2800, "name": "all_reduce"},
                                        {"filename": "/home/me/train.py", "line": line, "name": "step"}], **extra}


def _write(folder, rank, entries):
    (folder / f"{hang.RECORD}{rank}").write_bytes(pickle.dumps({"version": "2.10", "entries": entries}))


def test_nccl_s_records_name_the_call_that_timed_out_and_the_rank_that_never_reached_it(tmp_path):
    # rank 0 and 2 finished calls 1 and 2 and time out in 3; rank 1 finished 2, then went elsewhere. A send
    # (its own count) and a subgroup's call are no part of the default group's wavefront.
    send = {**_entry(9, "send", "completed", 50), "is_p2p": True}
    _write(tmp_path, 0, [_entry(1, "all_reduce", "completed", 40), _entry(2, "all_reduce", "completed", 40),
                         _entry(3, "all_gather", "started", 44), send])
    _write(tmp_path, 1, [_entry(1, "all_reduce", "completed", 40), _entry(2, "all_reduce", "completed", 40),
                         _entry(7, "all_reduce", "completed", 61, group=("5", "undefined"))])
    _write(tmp_path, 2, [_entry(2, "all_reduce", "completed", 40), _entry(3, "all_gather", "scheduled", 44)])
    (tmp_path / hang.STACK.format(3)).write_text("")   # a rank that ended on its own says nothing
    said = hang.explain(tmp_path, 4)
    waited = ("waited out the group's timeout (600 s) in call 3 of process group default_pg (all_gather, 8,192 B) "
              "at train.py:44 (step)")
    assert said == {0: waited, 2: waited,
                    1: "never reached call 3 of process group default_pg: its last was call 7 of process group 5 "
                       "(all_reduce, 8,192 B) at train.py:61 (step)"}


def test_a_rank_whose_calls_all_completed_and_that_no_one_waited_for_says_where_it_stopped(tmp_path):
    _write(tmp_path, 0, [_entry(1, "all_reduce", "completed", 40)])
    (tmp_path / hang.STACK.format(0)).write_text(
        'Stack (most recent call first):\n'
        f'  File "{sysconfig.get_path("stdlib")}/threading.py", line 320 in wait\n'
        f'  File "{sysconfig.get_path("purelib")}/torch/utils/data/dataloader.py", line 1133 in _get_data\n'
        '  File "/home/me/train.py", line 12 in load\n'
        '  File "/home/me/train.py", line 30 in <module>\n')
    assert hang.explain(tmp_path, 2) == {0: "stopped at train.py:12 (load)"}


def test_a_record_cut_off_is_said_unread_and_a_draft_is_no_record(tmp_path):
    (tmp_path / f"{hang.RECORD}0").write_bytes(b"\x80\x04garbage")
    (tmp_path / f"{hang.RECORD}1.draft").write_bytes(pickle.dumps({"entries": [_entry(1, "all_reduce", "x", 1)]}))
    said = hang.explain(tmp_path, 2)
    assert list(said) == [0] and said[0].startswith(f"its flight record {hang.RECORD}0 could not be read (")


def test_an_error_of_the_program_s_own_is_no_collective_s(tmp_path):
    try:
        raise ValueError("bad batch")
    except ValueError as exc:
        assert not hang.raised_in_collective(exc)
        hang.note(tmp_path, 0, exc)
    assert list(tmp_path.iterdir()) == []


def test_profile_names_the_collective_a_rank_timed_out_in_and_where_the_late_rank_was(tmp_path):
    """Two ranks under `roofline profile`: rank 1 sleeps through the all_reduce rank 0 waits in, which times out
    after the program's own 3 s; both are told at their lines, and nothing is left running."""
    program = tmp_path / "late.py"
    program.write_text(textwrap.dedent('''\
        import datetime, time, torch, torch.distributed as dist
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
        w = torch.nn.Parameter(torch.ones(4)); opt = torch.optim.SGD([w], lr=0.1)
        for step in range(4):
            w.sum().backward(); opt.step()
            if dist.get_rank() == 1 and step == 2:
                time.sleep(120)
            dist.all_reduce(w.grad)
        '''))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "roofline", "profile", "--nproc-per-node", "2", str(program)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=150,
                          env={**os.environ, "COLUMNS": "200"})
    assert time.perf_counter() - started < 90
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1, said[-3000:]
    # the all_reduces of steps 0 and 1 went through on both: rank 0 waits in its 3rd
    # its own error first (gloo's), then where it waited
    assert re.search(r"rank 0: RuntimeError: [^;]*Timed out waiting 3000ms[^;]*; waited [0-9.]+ s in call 3 of process "
                     r"group default_pg \(all_reduce, 16 B\) at late.py:8 \(<module>\)", said), said[-3000:]
    assert "rank 1: stopped at late.py:7 (<module>)" in said and "1 of the ranks failed" in said



def test_a_rank_armed_in_a_folder_reused_forgets_the_last_job_s_record(tmp_path, monkeypatch):
    for name in ("TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"):
        monkeypatch.setenv(name, "")   # so that the test's end puts each back as it was, arm's setting undone
        monkeypatch.delenv(name)
    _write(tmp_path, 1, [_entry(1, "all_reduce", "started", 40)])
    hang.arm(tmp_path, 1)
    try:
        assert hang.explain(tmp_path, 2) == {}
        assert os.environ["TORCH_FR_DUMP_TEMP_FILE"] == str(tmp_path / hang.RECORD)
    finally:
        hang.disarm(tmp_path, 1)
    assert not (tmp_path / hang.STACK.format(1)).exists()


def test_a_record_that_would_make_an_object_is_never_loaded(tmp_path):
    """The folder may be shared (a --rank-dir on a network file system): a record is read as plain data only."""
    class Planted:
        def __reduce__(self):
            return (os.system, ("touch planted",))

    (tmp_path / f"{hang.RECORD}0").write_bytes(pickle.dumps({"entries": [Planted()]}))
    said = hang.explain(tmp_path, 1)
    assert not (tmp_path / "planted").exists()
    # what could not be read is said, with why (a torch whose record holds more than plain data, say)
    assert said == {0: f"its flight record {hang.RECORD}0 could not be read (UnpicklingError: a flight record holds "
                       "no posix.system)"}


def test_a_job_forgets_the_last_job_s_records_and_stacks_of_its_ranks(tmp_path):
    _write(tmp_path, 0, [_entry(1, "all_reduce", "started", 40)])
    (tmp_path / hang.STACK.format(1)).write_text('  File "/u/train.py", line 12 in load\n')
    (tmp_path / hang.STACK.format(2)).write_text('  File "/u/train.py", line 30 in step\n')   # not this job's rank
    hang.forget(tmp_path, range(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == [hang.STACK.format(2)]
