"""scripts/hosts.py's command line: misuse named before anything starts, and the tool run from a copy under /tmp.

The misuse tests run the script as a user would (a subprocess) and need no
root and no cluster: every bad flag is refused before anything starts, with
one ``error:`` line and exit code 2, and ``status``, ``counters`` and ``run``
without a cluster say so (exit code 1), as do ``add`` and ``remove``;
``remove`` of host 0 or the store is refused before anything. The last tests
(root only) share one 2-host cluster, brought up by the tool from a copy of
the repository under /tmp, where each host has a private /tmp of its own: a
command run on a worker host; a worker host added and removed again, as
autoscaling and a spot reclaim do; and ``down``.
"""

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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


@pytest.mark.parametrize("command", [["status"], ["counters"], ["run", "0", "--", "true"], ["add"], ["remove", "2"]])
def test_without_a_cluster_status_counters_run_add_and_remove_say_so(command, tmp_path):
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


REMOVE_0 = "Host 0 cannot be removed: it runs the master and the driver; only worker hosts (1 and above) can."
REMOVE_STORE = ("Host -1 cannot be removed: it is the store, the cluster's shared S3 storage; only worker hosts "
                "(1 and above) can.")


@pytest.mark.parametrize("index, message", [("0", REMOVE_0), ("-1", REMOVE_STORE)], ids=["host0", "store"])
def test_removing_host_0_or_the_store_is_refused_before_looking_for_a_cluster(index, message, tmp_path):
    state = str(tmp_path / "state")
    assert hosts_py("remove", "--state-dir", state, index) == (2, "", f"error: {message}\n")
    assert not os.path.exists(state)
    cluster = hosts.Cluster(hosts=2, state_dir=state)
    with pytest.raises(ValueError) as info:
        cluster.remove_host(int(index))
    assert str(info.value) == message


def test_removing_a_host_the_cluster_lacks_names_the_hosts_it_has(tmp_path):
    state = str(tmp_path)
    cluster = hosts.Cluster(hosts=4, store=False, state_dir=state)
    del cluster.hosts[2]  # a cluster whose host 2 was removed
    cluster.hosts[0].anchor = os.getpid()  # alive: the state reads as a running cluster
    cluster._save()
    with open(cluster.state_path) as f:
        saved = f.read()
    assert hosts_py("remove", "--state-dir", state, "2") == (
        2, "", "error: There is no host 2 in this cluster: its hosts are 0, 1 and 3 (and no store).\n")
    with pytest.raises(ValueError, match=r"^There is no host 7 in this cluster: its hosts are 0, 1 and 3 "):
        hosts.Cluster.attach(cluster.state_path).remove_host(7)
    with open(cluster.state_path) as f:
        assert f.read() == saved  # nothing changed


def test_a_process_whose_leader_thread_exited_while_another_thread_lives_has_not_exited():
    # remove_host deletes a host's link once its processes have exited and their connections closed; a JVM's leader
    # thread shows "Z" while its other threads still exit, before its sockets close (the Connect elastic scenario's
    # loss then went unseen for the master's 60 s worker timeout). The leader here exits on its own (pthread_exit)
    # while a thread holds a listening socket.
    code = ("import ctypes, socket, sys, threading, time\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
            "threading.Thread(target=time.sleep, args=(60,)).start()\n"
            "print(s.getsockname()[1], flush=True)\n"
            "ctypes.CDLL(None).pthread_exit(None)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        deadline = time.monotonic() + 10
        while hosts._state(proc.pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hosts._state(proc.pid) == "Z"  # the leader thread is gone ...
        assert not hosts._zombie(proc.pid)  # ... but not the process: its socket is open
        thread = next(int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid)
        assert hosts._closing_sockets(thread, still_open=True) >= 1  # (read through the thread's network namespace)
        with open(f"/proc/{thread}/net/tcp") as f:
            assert any(line.split()[1].endswith(f":{port:04X}") and line.split()[3] == "0A" for line in f)
    finally:
        proc.kill()
        proc.wait(10)
    assert hosts._zombie(proc.pid)  # reaped


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


@pytest.fixture(scope="module")
def copy_cluster():
    """A 2-host cluster (no store) that the tool, run from a copy under /tmp, brought up (the working tree's tracked
    files, the venv linked). The module's cluster tests share it: one cluster comes up, not one per test (up and
    down took 21 s at load 10); the last of them takes it down with the copy's tool and checks that nothing is left."""
    try:
        hosts.check_requirements()
    except hosts.HostsError as exc:
        pytest.skip(str(exc))
    listed = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: no list of the repository's files to copy")
    base = f"/tmp/sdla-copy-{os.getpid()}"  # not tmp_path: pytest's base temp may be set outside /tmp
    repo, state = f"{base}/repo", f"{base}/state"
    shutil.rmtree(base, ignore_errors=True)
    try:
        for name in listed.stdout.decode().split("\0"):
            if name and os.path.isfile(os.path.join(ROOT, name)):
                os.makedirs(os.path.dirname(os.path.join(repo, name)), exist_ok=True)
                shutil.copy2(os.path.join(ROOT, name), os.path.join(repo, name))
        os.symlink(os.path.join(ROOT, ".venv"), os.path.join(repo, ".venv"))
        python, script = f"{repo}/.venv/bin/python", f"{repo}/scripts/hosts.py"
        code, out, err = hosts_py("up", "--hosts", "2", "--no-store", "--state-dir", state,
                                  script=script, python=python, timeout=180, cwd=repo)
        assert code == 0, out + err
        with open(f"{state}/state.json") as f:
            anchors = [h["anchor"] for h in json.load(f)["hosts"]]
        yield types.SimpleNamespace(base=base, repo=repo, state=state, python=python, script=script, anchors=anchors)
    finally:
        hosts.down(state)
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_the_tool_works_from_a_copy_of_the_repository_under_tmp(copy_cluster):
    """Up from the copy (``copy_cluster``), then a command on a worker host run by the copy's tool."""
    repo, python, script = copy_cluster.repo, copy_cluster.python, copy_cluster.script
    marker = f"{copy_cluster.base}/outside-{os.getpid()}"
    open(marker, "w").close()  # in this machine's /tmp, outside what the hosts share: no host sees it
    probe = ("import os, socket, sys, pyspark; "
             "print(socket.gethostname(), os.path.exists(sys.argv[1]), os.path.exists(sys.argv[2]), "
             "os.environ['SPARK_HOME'].startswith(sys.argv[3]))")
    code, out, err = hosts_py("run", "--state-dir", copy_cluster.state, "1", "--", python, "-c", probe, script, marker,
                              repo, script=script, python=python, cwd=repo)  # the user's directory: the copy
    assert (code, out) == (0, "sdla-h1 True False True\n"), err


def master_workers(cluster) -> dict:
    """The state of each worker the Spark master lists, by address (from its web UI's JSON, read on host 0)."""
    read = ("import json, sys, urllib.request; "
            "print(json.dumps(json.load(urllib.request.urlopen(sys.argv[1], timeout=10))['workers']))")
    out = cluster.run(0, [sys.executable, "-c", read, f"http://{cluster.hosts[0].address}:8080/json/"], timeout=30)
    states: dict = {}
    for worker in json.loads(out.stdout):  # a host's earlier workers stay listed as DEAD for a while
        if states.get(worker["host"]) != "ALIVE":
            states[worker["host"]] = worker["state"]
    return states


def eventually(read, expected, timeout_s: float = 10.0):
    """``read()`` once it returns ``expected``, or its last value after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = read()
        if value == expected or time.monotonic() > deadline:
            return value
        time.sleep(0.25)


@pytest.mark.slow
def test_a_worker_host_added_and_removed_while_the_cluster_runs(copy_cluster):
    """``add`` makes a host like the others, whose worker the master lists as alive; ``remove`` takes it away."""
    state, marker = copy_cluster.state, f"/tmp/sdla-outside-{os.getpid()}"
    try:
        assert hosts_py("add", "--state-dir", state, timeout=180) == (0, "2 sdla-h2\n", "")
        cluster = hosts.Cluster.attach(os.path.join(state, "state.json"))
        new = cluster.host(2)
        assert (new.ns, new.address, new.rate, set(new.pids)) == ("sdla-h2", "10.213.0.12", "1gbit", {"worker"})
        assert eventually(lambda: master_workers(cluster), {"10.213.0.11": "ALIVE", "10.213.0.12": "ALIVE"}) == \
            {"10.213.0.11": "ALIVE", "10.213.0.12": "ALIVE"}
        # Like the others: its name, a shaped link, a private /tmp, and names resolved both ways.
        open(marker, "w").close()  # in this machine's /tmp, outside what the hosts share
        probe = cluster.run(2, ["sh", "-c", "hostname; getent hosts sdla-h1; tc qdisc show dev eth0; "
                                            f"ls -d /tmp/spark-work {shlex.quote(marker)}"], check=False).stdout
        probe = probe.split("\n")
        assert probe[0] == "sdla-h2" and probe[1].split() == ["10.213.0.11", "sdla-h1"], probe
        assert " tbf " in probe[2] and "rate 1Gbit" in probe[2], probe
        assert probe[3:] == ["/tmp/spark-work", ""], probe  # its own /tmp: not the marker
        assert cluster.run(1, ["getent", "hosts", "sdla-h2"]).stdout.split() == ["10.213.0.12", "sdla-h2"]

        anchor = new.anchor
        assert hosts_py("remove", "--state-dir", state, "2") == (0, "removed sdla-h2\n", "")
        assert "sdla-h2" not in hosts._our_namespaces()
        assert not os.path.exists(f"/proc/{anchor}") or hosts._zombie(anchor)
        assert eventually(lambda: master_workers(cluster), {"10.213.0.11": "ALIVE", "10.213.0.12": "DEAD"}) == \
            {"10.213.0.11": "ALIVE", "10.213.0.12": "DEAD"}
        assert cluster.run(1, ["getent", "hosts", "sdla-h2"], check=False).returncode == 2  # not found
        assert [h.index for h in hosts.Cluster.attach(os.path.join(state, "state.json")).hosts] == [0, 1]

        # Again from Python, gracefully: the worker gets a SIGTERM first (and the index is free again).
        assert cluster.add_host() == 2 and [h.index for h in cluster.hosts] == [0, 1, 2]
        with open(os.path.join(state, "logs", "worker-2.log"), "rb") as f:
            logged = len(f.read())
        assert cluster.remove_host(2, graceful=True) and [h.index for h in cluster.hosts] == [0, 1]
        with open(os.path.join(state, "logs", "worker-2.log"), "rb") as f:
            assert b"RECEIVED SIGNAL TERM" in f.read()[logged:]
        assert "sdla-h2" not in hosts._our_namespaces()
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(marker)


@pytest.mark.slow
def test_down_from_the_copy_removes_every_namespace_and_process(copy_cluster):
    """Last of the module's cluster tests: the copy's ``down`` takes ``copy_cluster`` away, a host added and removed
    while it ran (the test before) included, and leaves no namespace, process or state file."""
    code, out, err = hosts_py("down", "--state-dir", copy_cluster.state, script=copy_cluster.script,
                              python=copy_cluster.python)
    assert code == 0 and sorted(out.split()) == ["removed", hosts.BRIDGE_NS, "sdla-h0", "sdla-h1"], out + err
    assert hosts.PREFIX + "-" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [p for p in copy_cluster.anchors if os.path.exists(f"/proc/{p}") and not hosts._zombie(p)]
    assert not {"state.json", "etc-hosts"} & set(os.listdir(copy_cluster.state))
