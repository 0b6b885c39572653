"""examples/ddp_train.py's print in turns: the A/B of a host sync in one run that benchmarks/distributed.py's
sync-advice holds profile's estimate against."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from examples import ddp_train  # noqa: E402


def test_each_pair_of_turns_is_the_steps_after_a_print_against_the_steps_after_none():
    # times[j] is step j + 1: after a print where step j printed (steps 5-7 and 11-13 print, turns of 3)
    times = [9.0] * 5 + [1.0, 2.0, 3.0, 7.0, 7.0, 8.0] + [4.0, 5.0, 6.0, 1.0, 1.0, 2.0] + [0.0]
    assert ddp_train._turns(times, 3) == [(3.0, 8.0), (6.0, 2.0)]   # each turn's first 2 steps left out


def test_rank_0_prints_in_turns_and_says_each_pair_s_medians(tmp_path):
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "examples/ddp_train.py", "--log-in-turns", "3", "--steps", str(5 + 2 * 3 * 2 + 1)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [int(n) for n in re.findall(r"^step (\d+): loss", done.stdout, re.MULTILINE)]
    # rank 0 alone, in the turns after the first five steps (the last step opens a turn that has no pair)
    assert printed == [6, 7, 8, 12, 13, 14, 18]
    pairs = re.search(r"the print in turns, a step after a print / after none \(ms\): (.+)$", done.stdout,
                      re.MULTILINE).group(1).split()
    assert len(pairs) == 2 and all(float(x) > 0 for pair in pairs for x in pair.split("/"))


@pytest.mark.parametrize("args", [["--log-in-turns", "2"], ["--log-in-turns", "3", "--log-every", "1"]])
def test_turns_too_short_to_settle_or_beside_log_every_are_refused(args):
    with pytest.raises(SystemExit):
        ddp_train.main(args)
