"""The tests' filter for lines Ray forwards to a driver's terminal (tests/support/ray_cluster.py)."""

from tests.support.ray_cluster import without_ray_lines


def test_lines_ray_forwards_are_dropped_and_the_commands_kept():
    raylet = ("\x1b[33m(raylet)\x1b[0m [2026-11-28 00:20:26,323 E 6253 6263] (raylet) file_system_monitor.cc:116: "
              "/tmp/ray/session_x is over 95% full\n")
    worker = "(DecodeWorker pid=4242) loading weights\n"
    ours = "run ray: 1/5 requests passed every grader (20%)\n  (chat) 0/1\n"
    assert without_ray_lines(ours + raylet + worker + "done\n") == ours + "done\n"
