# Deliberately non-portable: scripts/check-portable-tests.py must flag every line marked BAD.
import subprocess
from pathlib import Path


def children(pid):
    return [d for d in Path("/proc").iterdir()]  # BAD


def rss(pid):
    return Path(f"/proc/{pid}/status").read_text()  # BAD


def run():
    subprocess.run(["timeout", "5", "true"])  # BAD
    subprocess.run("grep -P 'a+' f", shell=True)  # BAD
    subprocess.run("sed -i 's/a/b/' f", shell=True)  # BAD
    subprocess.run(["readlink", "-f", "x"])  # BAD
    subprocess.run("sed -i '' 's/a/b/' f", shell=True)  # BAD: GNU sed reads '' as the script
    subprocess.run("readlink -f x; stat -c %s x; date -d yesterday", shell=True)  # BAD
    subprocess.run("ps -o pid= --ppid 1", shell=True)  # BAD
    subprocess.run("nproc", shell=True)  # BAD
    Path("/sys/fs/cgroup/cpu.max").read_text()  # BAD
