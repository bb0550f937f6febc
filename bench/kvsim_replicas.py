#!/usr/bin/env python3
"""Router replicas: N routers sharing the requests (a queue group), with and without gossip.

Replays the conversation trace at the heaviest load of the quality matrix (6x the trace's rate at
8 workers, scaled with the fleet) through kv on 1, 2, 4 and 8 routers, with gossip on and off,
twice: with the trace's arrivals as given (batches of about ten requests share a timestamp) and
spread over 3 s of trace time. Prints each row's hit rate, TTFT, ITL and E2E against one router's
with the same arrivals, and the routers' prediction error. Reports already in OUT are reused.

usage: bench/kvsim_replicas.py [--workers 8|32|N] [--out DIR] [--kvsim PATH] [--markdown]
"""
import os
from concurrent.futures import ThreadPoolExecutor

import kvsim_matrix as mx

ARRIVALS = [('as in the trace', []), ('spread over 3 s', ['--arrival-spread-ms', '3000'])]


def run(kvsim, workers, extra, out):
    """The replicas sweep (kvsim_matrix's cached_run: rerun when the binary or arguments
    changed)."""
    return mx.cached_run(kvsim, ['run', '--workload', 'conversation', '--workers', str(workers),
                                 '--policies', 'kv', '--sweep', '%g' % (6 * workers / 8.0),
                                 '--replicas', '1,2,4,8', '--gossip', 'both', '--quiet'] +
                         list(extra), out)


def main():
    a = mx.parser('/tmp/kvsim-replicas', jobs=False).parse_args()

    def one(arr):
        name, extra = arr
        tag = 'replicas_%d_%s' % (a.workers, 'spread' if extra else 'trace')
        return name, run(a.kvsim, a.workers, extra, os.path.join(a.out, tag))

    with ThreadPoolExecutor(2) as ex:
        runs = list(ex.map(one, ARRIVALS))
    head = ['arrivals', 'N', 'gossip', 'hit rate', 'hit / N=1', 'TTFT p50 (ms)', 'TTFT p90 (ms)',
            'p90 / N=1', 'TTFT mean / N=1', 'ITL mean / N=1', 'E2E mean / N=1', 'E2E p99 / N=1',
            'pred. err']
    if a.markdown:
        print('| ' + ' | '.join(head) + ' |')
        print('|---|---:|---|' + '---:|' * (len(head) - 3))
    else:
        print('  '.join(head))
    for name, res in runs:
        one_router = next(r for r in res if r['replicas'] == 1)

        def rel(r, k, s):
            return '%.3f' % (r[k][s] / one_router[k][s])

        for r in res:
            cells = [name, str(r['replicas']),
                     '-' if r['replicas'] == 1 else ('on' if r['gossip'] else 'off'),
                     '%.3f' % r['hit_rate'], '%.3f' % (r['hit_rate'] / one_router['hit_rate']),
                     '%.1f' % r['ttft_ms']['p50'], '%.1f' % r['ttft_ms']['p90'],
                     rel(r, 'ttft_ms', 'p90'), rel(r, 'ttft_ms', 'mean'),
                     rel(r, 'itl_ms', 'mean'), rel(r, 'e2e_ms', 'mean'), rel(r, 'e2e_ms', 'p99'),
                     '%.1f %%' % (100 * r['prediction_error']['relative'])]
            print(('| ' + ' | '.join(cells) + ' |') if a.markdown else '  '.join(cells))


if __name__ == '__main__':
    main()
