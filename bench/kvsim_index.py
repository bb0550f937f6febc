#!/usr/bin/env python3
"""Index sizing: the old fixed bound on the prefix index against the bound from the fleet.

Replays the conversation trace through every policy on three fleets (32 workers of 65,536 blocks
at 24x the trace's rate, 64 of 16,384 and 64 of 65,536 at 48x), once with the index bounded at
1,048,576 entries (the old fixed cap) and once with the bound from the fleet (1.25 x the announced
capacities), and prints kv's and sglang_cache_aware's figures (TTFT, hit rate against the
capacity reference, entries pruned while the engines still held them) and kv's ratios to the best
baseline on each figure (TTFT mean and p90, ITL mean, E2E mean and p99). Reports already in OUT are
reused.

usage: bench/kvsim_index.py [--out DIR] [--kvsim PATH] [--jobs J] [--markdown]
"""
import os
from concurrent.futures import ThreadPoolExecutor

import kvsim_matrix as mx

OLD_CAP = 1048576
FLEETS = [(32, 65536, 24), (64, 16384, 48), (64, 65536, 48)]  # workers, blocks each, rate
SHOWN = ['kv', 'sglang_cache_aware']
RATIOS = [f for f in mx.FIGURES if f[2] is not None and f[0] != 'ITL p99']


def main():
    a = mx.parser('/tmp/kvsim-index', workers=False).parse_args()
    cases = [(w, b, rate, bound) for w, b, rate in FLEETS for bound in (OLD_CAP, 0)]

    def one(case):
        w, blocks, rate, bound = case
        tag = 'conversation_%g_%dx%d_%d' % (rate, w, blocks, bound)
        res = mx.run(a.kvsim, 'conversation', rate, w, 'kv,' + ','.join(mx.BASELINES),
                     ['--num-blocks', str(blocks), '--index-max-entries', str(bound)],
                     os.path.join(a.out, tag))
        return case, res

    with ThreadPoolExecutor(a.jobs) as ex:
        rows = list(ex.map(one, cases))
    head = ['fleet', 'bound', 'policy', 'TTFT mean / p90 (ms)', 'hit', 'hit / capacity ref.',
            'pruned (live)'] + ['kv/best ' + f[0] for f in RATIOS]
    if a.markdown:
        print('| ' + ' | '.join(head) + ' |')
        print('|---|---:|---|' + '---:|' * (len(head) - 3))
    else:
        print('  '.join(head))
    for (w, blocks, rate, bound), res in rows:
        kv = next(r for r in res if r['policy'] == 'kv')
        base = [r for r in res if r['policy'] != 'kv']
        rs = mx.ratios(kv, base)
        for p in SHOWN:
            r = next(x for x in res if x['policy'] == p)
            cells = ['%d x %s, %gx' % (w, format(blocks, ','), rate),
                     format(r['index_max_entries'], ','), p,
                     '%.1f / %.1f' % (r['ttft_ms']['mean'], r['ttft_ms']['p90']),
                     '%.3f' % r['hit_rate'], '%.3f' % r['hit_of_capacity_ceiling'],
                     '%s (%s)' % (format(r['index_pruned'], ','),
                                  format(r['index_pruned_live'], ','))]
            if p == 'kv':
                cells += ['%.3f' % x for f, x in zip(mx.FIGURES, rs) if f in RATIOS]
            else:
                cells += [''] * len(RATIOS)
            print(('| ' + ' | '.join(cells) + ' |') if a.markdown else '  '.join(cells))


if __name__ == '__main__':
    main()
