#!/usr/bin/env python3
"""Whole-process before/after timing of `felixrs iptables roundtrip` and `felixrs render` (issue 26).

Usage: scripts/cli-speed-ab.py RUNS NAME=FELIXRS [NAME=FELIXRS ...] [--dir DIR]
  e.g. scripts/cli-speed-ab.py 7 before=/tmp/old/felixrs after=target/release/felixrs

Writes the inputs of `felixrs/benches/cli_speed.rs` into DIR (default /tmp/cli-speed-ab; kept and
reused when present): the 90,000-rule Calico-style filter dump (the same xorshift and lines as the
bench's `generated_dump`, 11.8 MB, kernel save format) and `scripts/gen-render-manifests.py DIR
20000 2000`, as JSON documents and as block-style YAML (`--yaml`). Each binary's roundtrip output is
checked to be its input byte for byte. Then, for each case, the binaries' runs alternate (stdout to
/dev/null), with a `cat` floor of the same input in the same run; best / median wall time of RUNS
runs is printed, with the load average before and after. Nothing here needs root or a build.
"""
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RULES, CHAINS, SETS = 90000, 900, 200


def generated_dump():
    """`generated_dump` of felixrs/benches/cli_speed.rs, line for line."""
    m64 = (1 << 64) - 1
    out = ["*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n"]
    names = sorted(f"cali-pi-{c:05x}bench" for c in range(CHAINS))
    out += [f":{n} - [0:0]\n" for n in names]
    x = 0x9E3779B97F4A7C15
    alpha = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
    for c, chain in enumerate(names):
        for r in range(RULES // CHAINS):
            x ^= (x << 13) & m64
            x ^= x >> 7
            x ^= (x << 17) & m64
            h = x
            hsh = "".join(chr(alpha[(h >> (i * 4)) % 64]) for i in range(16))
            st = h % SETS
            k = r % 5
            if k == 0:
                out.append(f'-A {chain} -m comment --comment "cali:{hsh}" -j MARK --set-xmark 0x0/0x30000\n')
            elif k == 1:
                out.append(
                    f'-A {chain} -p tcp -m comment --comment "cali:{hsh}" -m set --match-set cali40s-{st} src '
                    f"-m multiport --dports 80,443,{1024 + h % 60000} -j MARK --set-xmark 0x10000/0x10000\n"
                )
            elif k == 2:
                out.append(f'-A {chain} -m comment --comment "cali:{hsh}" -m mark --mark 0x10000/0x10000 -j RETURN\n')
            elif k == 3:
                out.append(
                    f"-A {chain} -s 10.{c % 256}.{r % 256}.0/24 -i cali+ -p udp -m comment "
                    f'--comment "cali:{hsh}" -m udp --dport {h % 65535} -m conntrack --ctstate NEW -j ACCEPT\n'
                )
            else:
                out.append(f'-A {chain} -m comment --comment "cali:{hsh}" -m set ! --match-set cali40s-{st} dst -j DROP\n')
    out.append("COMMIT\n")
    return "".join(out)


def inputs(d):
    os.makedirs(d, exist_ok=True)
    dump = os.path.join(d, "dump.txt")
    if not os.path.exists(dump):
        with open(dump + ".tmp", "w") as f:
            f.write(generated_dump())
        os.rename(dump + ".tmp", dump)
    gen = os.path.join(HERE, "gen-render-manifests.py")
    for sub, extra in (("manifests", []), ("manifests-yaml", ["--yaml"])):
        p = os.path.join(d, sub)
        if not os.path.isdir(p):
            subprocess.run([sys.executable, gen, *extra, p, "20000", "2000"], check=True)
    return dump, os.path.join(d, "manifests"), os.path.join(d, "manifests-yaml")


def files(d):
    return sorted(os.path.join(d, f) for f in os.listdir(d))


def loadavg():
    return " ".join(open("/proc/loadavg").read().split()[:3])


def main():
    args = sys.argv[1:]
    d = "/tmp/cli-speed-ab"
    if "--dir" in args:
        i = args.index("--dir")
        d = args[i + 1]
        del args[i : i + 2]
    if len(args) < 2:
        sys.exit(__doc__)
    runs = int(args[0])
    bins = [a.split("=", 1) for a in args[1:]]
    dump, js, ym = inputs(d)
    want = open(dump, "rb").read()
    for name, b in bins:
        got = subprocess.run([b, "iptables", "roundtrip", dump], capture_output=True, check=True).stdout
        if got != want:
            sys.exit(f"{name}: roundtrip output differs from the dump")
    cases = [
        ("roundtrip", ["cat", dump], lambda b: [b, "iptables", "roundtrip", dump]),
        ("render JSON", ["cat", *files(js)], lambda b: [b, "render", "--manifests", js, "--node-name", "node-0"]),
        ("render YAML", ["cat", *files(ym)], lambda b: [b, "render", "--manifests", ym, "--node-name", "node-0"]),
    ]
    print(f"nproc {os.cpu_count()}, load {loadavg()}; best / median of {runs}, runs alternating")
    for case, floor, cmd in cases:
        labels = [("cat", floor)] + [(n, cmd(b)) for n, b in bins]
        t = {n: [] for n, _ in labels}
        for _ in range(runs):
            for n, c in labels:
                s = time.perf_counter()
                subprocess.run(c, stdout=subprocess.DEVNULL, check=True)
                t[n].append(time.perf_counter() - s)
        first = None
        for n, _ in labels:
            v = sorted(t[n])
            best, med = v[0], v[len(v) // 2]
            extra = ""
            if case == "roundtrip" and n != "cat":
                extra += f"  = {RULES / best / 1e6:.2f} / {RULES / med / 1e6:.2f} M rules/s"
            if n != "cat":
                if first is None:
                    first = (best, med)
                else:
                    extra += f"  ({best / first[0]:.2f}x / {med / first[1]:.2f}x {bins[0][0]})"
            print(f"{case:<12} {n:<8} {best * 1e3:9.1f} / {med * 1e3:9.1f} ms{extra}")
    print(f"load {loadavg()}")


if __name__ == "__main__":
    main()
