#!/usr/bin/env python3
"""Approximate mode against event mode, over the loads of bench/kvsim_matrix.py.

For kv and sglang_cache_aware at every load of the quality matrix, runs kvsim with --approximate
(the engines' KV events withheld: the index learns from the router's own decisions, with its TTL)
and prints each policy's event-mode and approximate figures and their ratios (approximate over
event: TTFT mean and p90, ITL mean, E2E mean and p99, hit rate). The event-mode runs are the
matrix's own (kvsim_matrix.py's reports in OUT are reused, or run here when missing), so run the
matrix first with the same --out to share them.

usage: bench/kvsim_approx.py [--workers 8|32|N] [--out DIR] [--kvsim PATH] [--jobs J] [--markdown]
"""
import os
from concurrent.futures import ThreadPoolExecutor

import kvsim_matrix as mx

POLICIES = ['kv', 'sglang_cache_aware']
RATIOS = [('TTFT mean', 'ttft_ms', 'mean'), ('p90', 'ttft_ms', 'p90'),
          ('ITL mean', 'itl_ms', 'mean'), ('E2E mean', 'e2e_ms', 'mean'),
          ('E2E p99', 'e2e_ms', 'p99'), ('hit', 'hit_rate', None)]


def main():
    a = mx.parser('/tmp/kvsim-matrix').parse_args()

    def one(wl):
        workload, load, kv, base = mx.matrix_runs(a, wl)
        tag = '%s_%g_%d' % (workload, load, a.workers)
        event = {'kv': kv}
        event.update({b['policy']: b for b in base})
        approx = mx.run(a.kvsim, workload, load, a.workers, ','.join(POLICIES), ['--approximate'],
                        os.path.join(a.out, 'approx', tag))
        return workload, load, [(p, event[p], next(x for x in approx if x['policy'] == p))
                                for p in POLICIES]

    with ThreadPoolExecutor(a.jobs) as ex:
        rows = list(ex.map(one, mx.LOADS))
    head = ['workload', 'load', 'policy', 'event TTFT mean / p90 (ms)', 'event hit',
            'approx. TTFT mean / p90', 'approx. hit'] + ['approx/event ' + r[0] for r in RATIOS]
    if a.markdown:
        print('| ' + ' | '.join(head) + ' |')
        print('|---|---:|---|' + '---:|' * (len(head) - 3))
    else:
        print('  '.join(head))
    for workload, load, pols in rows:
        for p, ev, ap_ in pols:
            cells = [workload, '%g' % load, p,
                     '%.1f / %.1f' % (ev['ttft_ms']['mean'], ev['ttft_ms']['p90']),
                     '%.3f' % ev['hit_rate'],
                     '%.1f / %.1f' % (ap_['ttft_ms']['mean'], ap_['ttft_ms']['p90']),
                     '%.3f' % ap_['hit_rate']]
            cells += ['%.3f' % (mx.value(ap_, r) / mx.value(ev, r)) if mx.value(ev, r) else '-'
                      for r in RATIOS]
            print(('| ' + ' | '.join(cells) + ' |') if a.markdown else '  '.join(cells))


if __name__ == '__main__':
    main()
