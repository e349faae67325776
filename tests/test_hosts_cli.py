"""scripts/hosts.py's command line: misuse named before anything starts, and the tool run from a copy under /tmp.

The misuse tests run the script as a user would (a subprocess) and need no
root and no cluster: every bad flag is refused before anything starts, with
one ``error:`` line and exit code 2, and ``status``, ``counters`` and ``run``
without a cluster say so (exit code 1). The last test (root only) brings a
2-host cluster up from a copy of the repository under /tmp, where each host
has a private /tmp of its own, runs a command on a worker host and takes it
down again.
"""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "hosts.py")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import hosts  # noqa: E402


def hosts_py(*args: str, script: str = SCRIPT, python: str = sys.executable, timeout: float = 30,
             cwd: str = ROOT) -> tuple:
    """Runs ``python scripts/hosts.py ARGS`` in ``cwd``; returns (exit code, stdout, stderr)."""
    proc = subprocess.run([python, script, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)
    return proc.returncode, proc.stdout, proc.stderr


RATE = ("a link rate such as '1gbit' or '250mbit' (a number and tbit, gbit, mbit, kbit or bit, as tc writes rates; "
        "at least 8bit, tc's least)")
HOSTS = ("must be an int from 2 to 245: host 0 runs the master and the driver and each other host one worker, so a "
         "cluster needs at least 2 (addresses come from one /24)")
TTL = ("must be a finite number of seconds of at least 60: a watchdog tears the cluster down after it, and coming up "
       "takes about 20 s")


@pytest.mark.parametrize("args, message", [
    (["--ttl-s", "-5"], f"--ttl-s {TTL}. Got --ttl-s -5."),
    (["--ttl-s", "nan"], f"--ttl-s {TTL}. Got --ttl-s nan."),
    (["--worker-memory", "lots"], "--worker-memory must be a size such as '512m', '1g' or '2g' (a whole number above 0 "
                                  "and m, g or t: what each worker offers its executors). Got --worker-memory 'lots'."),
    (["--hosts", "0"], f"--hosts {HOSTS}. Got --hosts 0."),
    (["--hosts", "1"], f"--hosts {HOSTS}. Got --hosts 1."),
    (["--hosts", "246"], f"--hosts {HOSTS}. Got --hosts 246."),
    (["--rate", "fast"], f"--rate must be {RATE}. Got --rate 'fast'."),
    (["--store-rate", "0mbit"], f"--store-rate must be {RATE}. Got --store-rate '0mbit'."),
    (["--rate", "7bit"], f"--rate must be {RATE}. Got --rate '7bit'."),
    (["--state-dir", "/tmp"], "--state-dir must not be /tmp itself: each host mounts a private /tmp there and binds "
                              "back only the state directory; give a directory in it, such as /tmp/hosts. "
                              "Got --state-dir '/tmp'."),
])
def test_a_bad_up_flag_is_one_error_line_before_anything_starts(args, message, tmp_path):
    t0 = time.monotonic()
    code, out, err = hosts_py("up", "--state-dir", str(tmp_path / "state"), *args)
    assert (code, out, err) == (2, "", f"error: {message}\n")
    assert time.monotonic() - t0 < 10  # refused at once (these used to hang for minutes)
    assert not (tmp_path / "state").exists()  # nothing was started or written


def test_the_python_api_names_the_parameter():
    with pytest.raises(ValueError) as info:
        hosts.Cluster(hosts=1)
    assert str(info.value) == f"'hosts' {HOSTS}. Got hosts=1."
    with pytest.raises(ValueError, match=r"^'store_rate' must be a link rate such as .* Got store_rate='0mbit'\.$"):
        hosts.Cluster(store_rate="0mbit")
    assert hosts.rate_bytes("1gbit") == hosts.rate_bytes("1Gbit") == 1.25e8
    assert hosts.rate_bytes("2.5mbit") == 312_500
    assert hosts.rate_bytes("8bit") == 1.0


@pytest.mark.parametrize("command", [["status"], ["counters"], ["run", "0", "--", "true"]])
def test_without_a_cluster_status_counters_and_run_say_so(command, tmp_path):
    state = str(tmp_path / "state")
    assert hosts_py(command[0], "--state-dir", state, *command[1:]) == (
        1, "", f"error: no cluster is up; run `hosts.py up --state-dir {state}`\n")
    if os.path.exists(os.path.join(hosts.DEFAULT_STATE_DIR, "state.json")):
        pytest.skip("a cluster is up in the default state dir (make hosts-up)")
    assert hosts_py(*command) == (1, "", "error: no cluster is up; run `hosts.py up`\n")


def test_a_state_file_left_by_a_stopped_cluster_is_no_cluster(tmp_path):
    state = str(tmp_path)
    gone = subprocess.Popen(["true"])
    gone.wait()
    cluster = hosts.Cluster(hosts=2, store=False, state_dir=state)
    cluster.hosts[0].anchor = gone.pid  # host 0's namespaces' holder: exited
    cluster._save()
    assert hosts_py("status", "--state-dir", state) == (
        1, "", f"error: no cluster is up (the one {state}/state.json describes stopped); "
               f"run `hosts.py up --state-dir {state}`\n")


def test_run_on_a_host_the_cluster_lacks_names_the_hosts_it_has(tmp_path):
    state = str(tmp_path)
    cluster = hosts.Cluster(hosts=3, store=False, state_dir=state)
    cluster.hosts[0].anchor = os.getpid()  # alive: the state reads as a running cluster
    cluster._save()
    assert hosts_py("run", "--state-dir", state, "7", "--", "true") == (
        2, "", "error: There is no host 7 in this cluster: its hosts are 0 to 2 (and no store).\n")



def test_run_from_a_directory_in_this_machines_tmp_names_what_the_hosts_share(tmp_path):
    state = str(tmp_path)  # wherever pytest's temp is: the state dir the hosts share
    cluster = hosts.Cluster(hosts=2, store=False, state_dir=state)
    cluster.hosts[0].anchor = os.getpid()
    cluster._save()
    elsewhere = f"/tmp/sdla-cwd-{os.getpid()}"
    os.makedirs(elsewhere, exist_ok=True)
    try:
        proc = subprocess.run([sys.executable, SCRIPT, "run", "--state-dir", state, "0", "--", "true"],
                              capture_output=True, text=True, cwd=elsewhere, timeout=30)
    finally:
        os.rmdir(elsewhere)
    shared = ", ".join(cluster.shared) or "nothing"
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2, "", f"error: The current directory {elsewhere} is in this machine's /tmp, which the hosts do not see "
               f"(each has its own; of /tmp they share only {shared}); run from another directory, such as {ROOT}.\n")


@pytest.mark.slow
def test_the_tool_works_from_a_copy_of_the_repository_under_tmp():
    """A copy under /tmp (the working tree's tracked files, the venv linked): up, a command on a worker host, down."""
    try:
        hosts.check_requirements()
    except hosts.HostsError as exc:
        pytest.skip(str(exc))
    listed = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: no list of the repository's files to copy")
    base = f"/tmp/sdla-copy-{os.getpid()}"  # not tmp_path: pytest's base temp may be set outside /tmp
    repo, state, marker = f"{base}/repo", f"{base}/state", f"{base}/outside-{os.getpid()}"
    shutil.rmtree(base, ignore_errors=True)
    try:
        for name in listed.stdout.decode().split("\0"):
            if name and os.path.isfile(os.path.join(ROOT, name)):
                os.makedirs(os.path.dirname(os.path.join(repo, name)), exist_ok=True)
                shutil.copy2(os.path.join(ROOT, name), os.path.join(repo, name))
        os.symlink(os.path.join(ROOT, ".venv"), os.path.join(repo, ".venv"))
        python, script = f"{repo}/.venv/bin/python", f"{repo}/scripts/hosts.py"
        open(marker, "w").close()  # in this machine's /tmp, outside what the hosts share: no host sees it

        code, out, err = hosts_py("up", "--hosts", "2", "--no-store", "--state-dir", state,
                                  script=script, python=python, timeout=180, cwd=repo)
        assert code == 0, out + err
        with open(f"{state}/state.json") as f:
            anchors = [h["anchor"] for h in json.load(f)["hosts"]]
        probe = ("import os, socket, sys, pyspark; "
                 "print(socket.gethostname(), os.path.exists(sys.argv[1]), os.path.exists(sys.argv[2]), "
                 "os.environ['SPARK_HOME'].startswith(sys.argv[3]))")
        code, out, err = hosts_py("run", "--state-dir", state, "1", "--", python, "-c", probe, script, marker, repo,
                                  script=script, python=python, cwd=repo)  # the user's directory: the copy
        assert (code, out) == (0, "sdla-h1 True False True\n"), err
        code, out, err = hosts_py("down", "--state-dir", state, script=script, python=python)
        assert code == 0 and sorted(out.split()) == ["removed", hosts.BRIDGE_NS, "sdla-h0", "sdla-h1"], out + err
        assert hosts.PREFIX + "-" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not [p for p in anchors if os.path.exists(f"/proc/{p}") and not hosts._zombie(p)]
        assert not {"state.json", "etc-hosts"} & set(os.listdir(state))
    finally:
        hosts.down(state)
        shutil.rmtree(base, ignore_errors=True)
