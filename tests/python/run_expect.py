"""run_expect.py --rc RC [--expect REGEX]... -- COMMAND...: run COMMAND (tdistrun ...),
print its output, pass iff it exits with RC and every REGEX matches a line of its output
(ctest cannot say "this exit code, and these lines" otherwise)."""
import re
import subprocess
import sys

args = sys.argv[1:]
sep = args.index("--")
opts, cmd = args[:sep], args[sep + 1:]
rc_want, expects = 0, []
i = 0
while i < len(opts):
    if opts[i] == "--rc":
        rc_want = int(opts[i + 1])
    elif opts[i] == "--expect":
        expects.append(opts[i + 1])
    i += 2
p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
sys.stdout.write(p.stdout)
bad = []
if p.returncode != rc_want:
    bad.append(f"exit code {p.returncode}, expected {rc_want}")
for rx in expects:
    if not re.search(rx, p.stdout, re.M):
        bad.append(f"no line matches {rx!r}")
for b in bad:
    print("run_expect: FAILED:", b)
sys.exit(1 if bad else 0)
