#!/usr/bin/env python3
"""kv against the best baseline on every figure, over the loads of docs/benchmarks.md.

Runs kvsim once per (workload, load, fleet size) for the eight baselines and once for kv, and
prints, per load, kv's figure over the best baseline's figure (TTFT mean and p90, ITL mean and
p99, end-to-end mean and p99: lower is better; throughput: the best baseline's over kv's, so a
ratio above 1 always means kv lost). Reports already in OUT are reused when the same kvsim binary
(its SHA-256) made them with the same arguments (a report.key.json beside each says so); else the
run is made again. So a second variant of kv reruns only kv, and a new build or other flags are
never shown old figures. ITL mean is kvsim's pooled mean over every inter-token gap (report.json's
itl_ms), not the per-request mean (itl_per_request_ms).

The last columns put each policy's worst figure side by side: kv's worst ratio, and the lowest
worst ratio any one baseline reaches against the same best figures (with its name). The best
figures of a load often come from different baselines (one spreads, another packs); where no
baseline reaches 1 on all seven, no single policy of the eight is first on every figure there, and
kv's worst against theirs says whether it is the closest.

usage: bench/kvsim_matrix.py [--workers 8|32|N] [--out DIR] [--kvsim PATH] [--jobs J]
                              [--name NAME] [--seed S] [--markdown] [-- extra kvsim flags for kv]
Loads scale with the fleet: N workers run the 8-worker loads times N/8. --seed (kvsim's, for kv
and the baselines alike) draws other requests, arrivals and tie-breaks: a change that moves a
figure by less than it moves between seeds is noise.
"""
import argparse
import hashlib
import json
import os
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINES = ['random', 'round_robin', 'least_loaded', 'power_of_two', 'prefix_only',
             'sglang_cache_aware', 'llmd_weighted', 'chwbl']
FIGURES = [('TTFT mean', 'ttft_ms', 'mean'), ('TTFT p90', 'ttft_ms', 'p90'),
           ('ITL mean', 'itl_ms', 'mean'), ('ITL p99', 'itl_ms', 'p99'),
           ('E2E mean', 'e2e_ms', 'mean'), ('E2E p99', 'e2e_ms', 'p99'),
           ('tok/s', 'throughput_tok_s', None)]
LOADS = [('seed', 10), ('seed', 20), ('seed-isl', 20), ('seed-osl', 20), ('conversation', 1),
         ('conversation', 3), ('conversation', 6), ('synthetic', 2), ('synthetic', 4),
         ('synthetic', 5), ('burst', 1), ('burst', 4), ('burst', 8)]
TIE = 0.0005  # ratios within this of 1 count as equal


_digests = {}
_digests_lock = threading.Lock()


def binary_digest(path):
    """The SHA-256 of the file at path, once per (path, size, mtime) in this process."""
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns)
    with _digests_lock:
        if key in _digests:
            return _digests[key]
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 20), b''):
            h.update(chunk)
    with _digests_lock:
        _digests[key] = h.hexdigest()
    return _digests[key]


def cached_run(kvsim, args, out):
    """kvsim's results for `kvsim args`: from out/report.json when the key beside it says the same
    binary made it with the same arguments, else from a new run into out. Paths are taken
    relative to the caller's directory (kvsim runs in ROOT, to find the traces)."""
    out = os.path.abspath(out)
    if os.sep in kvsim:
        kvsim = os.path.abspath(kvsim)
    report = os.path.join(out, 'report.json')
    sidecar = os.path.join(out, 'report.key.json')
    key = {'args': args, 'kvsim_sha256': binary_digest(kvsim),
           'KVR_TRACES': os.environ.get('KVR_TRACES')}
    try:
        with open(sidecar) as f:
            fresh = json.load(f) == key and os.path.exists(report)
    except (OSError, ValueError):
        fresh = False
    if not fresh:
        if os.path.exists(sidecar):
            os.remove(sidecar)  # a run that fails leaves no key to vouch for the old report
        subprocess.run([kvsim] + args + ['--out', out], check=True, stdout=subprocess.DEVNULL,
                       cwd=ROOT)
        with open(sidecar + '.tmp', 'w') as f:
            json.dump(key, f)
        os.replace(sidecar + '.tmp', sidecar)
    with open(report) as f:
        return json.load(f)['results']


def run(kvsim, workload, load, workers, policies, extra, out):
    """One cell of the matrix (cached_run)."""
    flag = '--concurrency' if workload.startswith('seed') else '--rate-scale'
    args = ['run', '--workload', workload, '--workers', str(workers), '--policies', policies,
            flag, '%g' % load, '--quiet'] + list(extra)
    return cached_run(kvsim, args, out)


def value(r, fig):
    return r[fig[1]] if fig[2] is None else r[fig[1]][fig[2]]


def ratios(kv, base):
    out = []
    for fig in FIGURES:
        vals = [value(b, fig) for b in base]
        if fig[2] is None:
            best = max(vals)
            out.append(best / value(kv, fig))
        else:
            best = min(vals)
            out.append(value(kv, fig) / best)
    return out


def worst_ratios(kv, base):
    """kv's worst ratio to the best figures, and the lowest worst ratio of any one baseline to the
    same best figures, with that baseline's name."""
    bw = min((max(ratios(b, base)), b['policy']) for b in base)
    return max(ratios(kv, base)), bw[0], bw[1]


def parser(out, workers=True, jobs=True):
    """The options the bench/kvsim_*.py scripts share, out the default of --out."""
    ap = argparse.ArgumentParser()
    if workers:
        ap.add_argument('--workers', type=int, default=8)
    ap.add_argument('--out', default=out)
    ap.add_argument('--kvsim', default=os.path.join(ROOT, 'build', 'src', 'kvsim'))
    if jobs:
        ap.add_argument('--jobs', type=int, default=2)
    ap.add_argument('--markdown', action='store_true')
    return ap


def matrix_runs(a, wl, name='kv', extra=()):
    """The matrix's runs of load wl at a.workers (run, or reused from a.out): (workload, load,
    kv's result, the baselines' results)."""
    workload, load = wl[0], wl[1] * a.workers / 8.0
    seed = getattr(a, 'seed', 1)
    tag = '%s_%g_%d' % (workload, load, a.workers) + ('_s%d' % seed if seed != 1 else '')
    flags = ['--seed', str(seed)] if seed != 1 else []
    base = run(a.kvsim, workload, load, a.workers, ','.join(BASELINES), flags,
               os.path.join(a.out, 'baselines', tag))
    kv = run(a.kvsim, workload, load, a.workers, 'kv', flags + list(extra),
             os.path.join(a.out, name, tag))[0]
    return workload, load, kv, base


def main():
    ap = parser('/tmp/kvsim-matrix')
    ap.add_argument('--name', default='kv')
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('extra', nargs='*')
    a = ap.parse_args()
    with ThreadPoolExecutor(a.jobs) as ex:
        rows = list(ex.map(lambda wl: matrix_runs(a, wl, a.name, a.extra), LOADS))
    lost = closest = reachable = 0
    per_req = []  # kv's per-request ITL mean over the best baseline's, where reports carry it
    if a.markdown:
        print('| workload | load | kv TTFT mean / p90 (ms) | ' +
              ' | '.join('kv/best ' + f[0] for f in FIGURES) +
              ' | kv hit | best hit | kv worst | a baseline\'s least worst |')
        print('|---|---:|---:|' + '---:|' * len(FIGURES) + '---:|---:|---:|---|')
    else:
        print('%-14s %6s ' % ('workload', 'load') + ''.join('%10s' % f[0] for f in FIGURES) +
              '   kv hit / best   worst: kv / one baseline')
    for workload, load, kv, base in rows:
        rs = ratios(kv, base)
        lost += sum(x > 1 + TIE for x in rs)
        hit = max(b['hit_rate'] for b in base)
        worst, bworst, bname = worst_ratios(kv, base)
        closest += worst <= bworst + TIE
        reachable += bworst <= 1 + TIE
        if 'itl_per_request_ms' in kv and all('itl_per_request_ms' in b for b in base):
            best = min(b['itl_per_request_ms']['mean'] for b in base)
            if best > 0:
                per_req.append((workload, load, kv['itl_per_request_ms']['mean'] / best))
        if a.markdown:
            cells = ['**%.3f**' % x if x > 1 + TIE else '%.3f' % x for x in rs]
            print('| %s | %g | %.1f / %.1f | %s | %.3f | %.3f | %.3f | %.3f %s |' %
                  (workload, load, kv['ttft_ms']['mean'], kv['ttft_ms']['p90'],
                   ' | '.join(cells), kv['hit_rate'], hit, worst, bworst, bname))
        else:
            print('%-14s %6g ' % (workload, load) +
                  ''.join('%9.3f%s' % (x, '*' if x > 1 + TIE else ' ') for x in rs) +
                  '   %.3f / %.3f     %.3f / %.3f %s' % (kv['hit_rate'], hit, worst, bworst, bname))
    print('\nfigures where kv is behind the best baseline: %d of %d' %
          (lost, len(rows) * len(FIGURES)))
    print('loads where one baseline is first on every figure: %d of %d; where kv\'s worst figure '
          'is at most every baseline\'s worst: %d of %d' % (reachable, len(rows), closest, len(rows)))
    if per_req:  # not in the table: the tables use the pooled mean (docs/benchmarks.md)
        behind = [r for r in per_req if r[2] > 1 + TIE]
        print('ITL mean per request (the mean of each request\'s mean gap), kv over the best '
              'baseline: behind at %d of %d loads; %s' %
              (len(behind), len(per_req),
               ', '.join('%s %g %.3f' % r for r in per_req)))


if __name__ == '__main__':
    main()
