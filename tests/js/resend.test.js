// Resending (docs/protocol.md "Resending"): the same request (same inbox, same request_id, same
// bytes) published again at every moment is one request: one stream, once. Each timing runs
// KVR_JS_TRIALS times (default 20), 20 trials at a time.
import { test } from "node:test";
import assert from "node:assert/strict";
import { useFleet } from "./lib/setup.js";
import { svc, waitUntil } from "./lib/fleet.js";
import {
  generate, publishGenerate, prompt, freshSeed, rid, streamProblems, sleep,
} from "./lib/client.js";
import { BUSY_ROUTER_ARGS, BUSY_WORKER_ARGS, fillWorkers, releaseFillers } from "./lib/busy.js";
import { encode } from "./lib/proto.js";

const NS = "rsnd";
const BUSY = "rbusy";
const TRIALS = Math.max(1, Number(process.env.KVR_JS_TRIALS || 20));
const WAVE = 20;
const TT = { timeout: 60000 + TRIALS * 3000 }; // per test
const QUIET_MS = 500; // after the final chunk: anything more is a violation

const OVER = "rover"; // busy workers and a short queue timeout: waiting ends "overloaded"
const OVER_ROUTER_ARGS = [...BUSY_ROUTER_ARGS.slice(0, -2), "--queue-timeout-ms", "400"];

const GONE = "rgone"; // its one worker drains and exits after a request

const h = useFleet("resend", [
  { ns: NS, routers: ["rsnd-r1", "rsnd-r2"], workers: [401, 402] },
  { ns: GONE, routers: ["rgone-r1", "rgone-r2"], workers: [431] },
  { ns: BUSY, routers: ["rbusy-r1", "rbusy-r2"], workers: [411, 412],
    routerArgs: BUSY_ROUTER_ARGS, workerArgs: BUSY_WORKER_ARGS },
  { ns: OVER, routers: ["rover-r1", "rover-r2"], workers: [421],
    routerArgs: OVER_ROUTER_ARGS, workerArgs: BUSY_WORKER_ARGS },
]);

// A resend while the stream is in flight may bring the tokens so far again (docs/protocol.md,
// "Resending"): a repeat, from position 0, whose tokens agree with those already received.
function repeatProblems(s) {
  const p = [];
  const byPos = [];
  let n = 0;
  s.chunks.forEach((c, i) => {
    if (c.position < n) {
      if (c.position !== 0) p.push(`chunk #${i} repeats from position ${c.position}: a repeat starts at 0`);
      c.token_ids.forEach((t, k) => {
        const at = c.position + k;
        if (at < n && String(byPos[at]) !== String(t)) p.push(`chunk #${i} repeats position ${at} with another token`);
      });
    }
    c.token_ids.forEach((t, k) => { byPos[c.position + k] = t; });
    n = Math.max(n, c.position + c.token_ids.length);
  });
  return p.slice(0, 3);
}

// The contract's demands on one resent request's stream, as a list of problems.
function trialProblems(s, req) {
  const p = streamProblems(s, { requestId: req.request_id, maxTokens: req.max_tokens,
    strictPositions: false });
  p.push(...repeatProblems(s));
  const f = s.final;
  if (f && f.error_code !== 0) p.push(`the final chunk must be OK (0), got ${f.error_code} ("${f.error}")`);
  if (f && f.finish_reason !== "length") p.push(`finish_reason must be "length", got "${f.finish_reason}"`);
  return p;
}

// How many trials had each kind of problem (figures replaced by #), most common first.
function tally(failures) {
  const counts = new Map();
  for (const r of failures) {
    for (const k of new Set(r.problems.map((x) => x.replace(/\d+/g, "#").replace(/"[^"]*"/g, '"…"')))) {
      counts.set(k, (counts.get(k) || 0) + 1);
    }
  }
  return [...counts].sort((a, b) => b[1] - a[1]).slice(0, 6).map(([k, n]) => `${n}x ${k}`).join("\n    ");
}

// Run `trials` of one timing, WAVE at a time. trial(ctx) puts its stream and request in ctx at
// once (for the report, if it throws) and returns {s, req, pre}, pre: whether the resend happened
// in the state the timing names, as far as the client can tell.
async function runTrials(timing, trial) {
  const failures = [];
  let pre = 0;
  for (let done = 0; done < TRIALS; done += WAVE) {
    const n = Math.min(WAVE, TRIALS - done);
    const results = await Promise.all(Array.from({ length: n }, async (_, i) => {
      const ctx = {}; // the trial's stream and request, as soon as it has them
      try {
        const r = await trial(ctx);
        r.s.close();
        return { ...r, problems: trialProblems(r.s, r.req) };
      } catch (e) {
        if (ctx.s) ctx.s.close();
        return { ...ctx, problems: [e.message] };
      }
    }));
    for (const r of results) {
      if (r.pre) pre++;
      if (r.problems.length) failures.push(r);
    }
  }
  const msg = failures.slice(0, 2).map((r, i) => `trial ${i + 1}` +
    (r.req ? ` (request_id ${r.req.request_id}, reply ${r.s.inbox})` : "") +
    `:\n    - ${r.problems.join("\n    - ")}` +
    (r.s ? `\n    stream: ${r.s.summary()}` : "")).join("\n  ");
  assert.ok(failures.length === 0, `resent ${timing}: ${failures.length} of ${TRIALS} trials broke ` +
    `the contract (one stream, once: one final, contiguous positions, one worker_id, ` +
    `max_tokens tokens, nothing after the final)\n  problems, by trials:\n    ${tally(failures)}\n  ${msg}`);
  return pre;
}

const small = (tag, extra = {}) => ({ request_id: rid(tag), token_ids: prompt(100, freshSeed()), max_tokens: 16, ...extra });

test(`resend at 0 ms (back to back), ${TRIALS} trials`, TT, async () => {
  await runTrials("at 0 ms", async (ctx) => {
    const req = small("rs0");
    const s = generate(h.nc, NS, req);
    Object.assign(ctx, { s, req });
    publishGenerate(h.nc, NS, s);
    await s.complete(10000, QUIET_MS);
    return { s, req, pre: true };
  });
});

test(`resend at ~1 ms, ${TRIALS} trials`, TT, async () => {
  await runTrials("at ~1 ms", async (ctx) => {
    const req = small("rs1");
    const s = generate(h.nc, NS, req);
    Object.assign(ctx, { s, req });
    await sleep(1);
    const pre = s.msgs.length === 0;
    publishGenerate(h.nc, NS, s);
    await s.complete(10000, QUIET_MS);
    return { s, req, pre };
  });
});

test(`resend while queued (every worker busy), ${TRIALS} trials`, TT, async () => {
  let pre = 0;
  for (let done = 0; done < TRIALS; done += WAVE) {
    const n = Math.min(WAVE, TRIALS - done);
    const { fillers, confirmed } = await fillWorkers(h.nc, BUSY, 2, 100);
    const trials = [];
    try {
      for (let i = 0; i < n; i++) {
        const req = { request_id: rid("rsq"), token_ids: prompt(32, freshSeed()), max_tokens: 8 };
        trials.push({ req, s: generate(h.nc, BUSY, req) });
      }
      await sleep(300);
      for (const t of trials) {
        t.pre = t.s.msgs.length === 0;
        if (t.pre) pre++;
        publishGenerate(h.nc, BUSY, t.s);
      }
      await sleep(200);
    } finally {
      await releaseFillers(h.nc, BUSY, fillers);
    }
    const res = await Promise.all(trials.map(async (t) => {
      try {
        await t.s.complete(30000, QUIET_MS);
        t.problems = trialProblems(t.s, t.req);
      } catch (e) {
        t.problems = [e.message];
      }
      t.s.close();
      return t;
    }));
    const bad = res.filter((t) => t.problems.length);
    assert.ok(bad.length === 0, `resent while queued (selects saw every worker busy: ${confirmed}): ` +
      `${bad.length} of ${n} trials broke the contract\n  problems, by trials:\n    ${tally(bad)}\n  ` +
      bad.slice(0, 2).map((t, i) => `trial ${i + 1} (request_id ${t.req.request_id}, reply ${t.s.inbox}):\n    - ${t.problems.join("\n    - ")}\n    stream: ${t.s.summary()}`).join("\n  "));
  }
  assert.ok(pre > 0, `test set-up: no request was still waiting when it was resent (${TRIALS} trials)`);
});

test(`resend while prefilling (a long prompt, before the first token), ${TRIALS} trials`, TT, async (t) => {
  const pre = await runTrials("while prefilling", async (ctx) => {
    const req = { request_id: rid("rsp"), token_ids: prompt(6000, freshSeed()), max_tokens: 16 };
    const s = generate(h.nc, NS, req);
    Object.assign(ctx, { s, req });
    await sleep(40);
    const before = s.msgs.length === 0;
    publishGenerate(h.nc, NS, s);
    await s.complete(15000, QUIET_MS);
    return { s, req, pre: before };
  });
  t.diagnostic(`${pre} of ${TRIALS} resends came before the first token`);
  assert.ok(pre > 0, `test set-up: every resend came after the first token (${TRIALS} trials)`);
});

test(`resend while decoding (after 3 chunks), ${TRIALS} trials`, TT, async () => {
  await runTrials("while decoding", async (ctx) => {
    const req = small("rsd", { max_tokens: 24 });
    const s = generate(h.nc, NS, req);
    Object.assign(ctx, { s, req });
    await s.waitChunks(3, 10000);
    const pre = !s.final;
    publishGenerate(h.nc, NS, s);
    await s.complete(10000, QUIET_MS);
    return { s, req, pre };
  });
});

// What a resend after the final chunk brings: one repeat of the whole stream (the client resends
// only when nothing came, so the fleet takes the stream as lost), nothing else; a client ignores
// it once it has the stream.
function afterFinalProblems(s, extra) {
  const chunks = extra.map((m) => m.chunk);
  if (extra.length === 0) return ["a resend within 10 s of the end must bring the stream again (its worker keeps it that long), nothing came"];
  if (extra.length > 1 || !chunks[0]) {
    return [`after a resend that followed the final, at most one repeat may come, got ${extra.length} message(s)`];
  }
  const r = chunks[0];
  const toks = s.chunks.flatMap((c) => c.token_ids.map(String));
  const p = [];
  if (r.position !== 0 || !r.final) p.push(`the repeat must start at position 0 and be final, got position ${r.position}, final ${r.final}`);
  if (r.worker_id !== s.chunks[0].worker_id) p.push(`the repeat must come from the stream's worker ${s.chunks[0].worker_id}, got ${r.worker_id}`);
  if (r.token_ids.map(String).join(",") !== toks.join(",")) p.push(`the repeat must carry the stream's tokens (${toks.length}), got ${r.token_ids.length}`);
  return p;
}

test(`resend after the final chunk: the stream again, once, ${TRIALS} trials`, TT, async () => {
  await runTrials("after the final chunk", async (ctx) => {
    const req = small("rsf", { max_tokens: 8 });
    const s = generate(h.nc, NS, req);
    Object.assign(ctx, { s, req });
    await s.waitFinal(10000);
    await sleep(QUIET_MS);
    const n = s.msgs.length;
    publishGenerate(h.nc, NS, s);
    publishGenerate(h.nc, NS, s); // twice: a stream is repeated once a second at most
    await sleep(1000);
    const extra = s.msgs.splice(n);
    const p = afterFinalProblems(s, extra);
    if (p.length) throw new Error(p.join("; "));
    return { s, req, pre: true };
  });
});

// A resend after the final chunk whose worker has left the fleet since (drained and exited, as
// in a rolling restart): nobody can repeat the stream, so the router answers the resend with a
// final ERR_WORKER_LOST (17) naming that worker, through either router (docs/protocol.md
// "Resending"); a client that had the stream ignores it, one that lacked it tries again.
test("resend after the final chunk, its worker gone: a final ERR_WORKER_LOST (17) naming it", TT, async (t) => {
  const req = small("rgn", { max_tokens: 8 });
  const s = generate(h.nc, GONE, req);
  await s.waitFinal(10000);
  const wid = s.final.worker_id;
  const entry = h.fleet.procs.find((x) => x.name === `kvworker-${GONE}-${wid}`);
  assert.ok(entry, `the stream's worker_id (${wid}) is the worker started (431)`);
  await h.fleet.kill(entry, "SIGTERM"); // nothing in flight: it drains at once and exits
  await waitUntil(async () => {
    const rs = (await svc(h.nc, "stats", "kvrouter"))
      .filter((r) => String(r.metadata?.router_id || "").startsWith(`${GONE}-`));
    const left = rs.map((r) => r.endpoints.find((e) => e.name === "generate").data.workers_left);
    return rs.length === 2 && left.every((n) => n >= 1);
  }, 10000, `both ${GONE} routers counting worker ${wid} gone (workers_left)`, 100);
  const n = s.msgs.length;
  const t0 = Date.now();
  publishGenerate(h.nc, GONE, s);
  await s.waitFor((x) => x.msgs.length > n, 5000, "an answer to the resend");
  t.diagnostic(`the resend was answered after ${Date.now() - t0} ms`);
  await sleep(QUIET_MS);
  const extra = s.msgs.slice(n).map((m) => m.chunk);
  const p = [];
  if (extra.length !== 1) p.push(`one answer to the resend, got ${extra.length} message(s)`);
  const f = extra[0] || {};
  if (!f.final || f.error_code !== 17) p.push(`a final ERR_WORKER_LOST (17), got final ${f.final}, code ${f.error_code} "${f.error}"`);
  if (f.worker_id !== wid) p.push(`it names the worker that left (${wid}), got ${f.worker_id}`);
  if (f.request_id !== req.request_id) p.push(`it carries request_id "${req.request_id}", got "${f.request_id}"`);
  assert.ok(p.length === 0, p.join("; ") + `: ${s.summary()}`);
});

// A resend that crossed a final error on its way (sent before the error arrived) is taken for
// one and ignored, through either router; the same request sent 3 s or more after the error is
// a new attempt, and so is, at once, a retry under a new request_id on the same inbox
// (docs/protocol.md "Resending"). Every worker busy, a 400 ms queue timeout: the request waits,
// then ends ERR_OVERLOADED (7).
test("a resend crossing an error answer is ignored; 3 s later, or under a new id at once, it is a new attempt", TT, async () => {
  const n = 6;
  const { fillers, confirmed } = await fillWorkers(h.nc, OVER, 1, 300);
  try {
    const trials = [];
    for (let i = 0; i < n; i++) {
      const req = { request_id: rid("rcx"), token_ids: prompt(32, freshSeed()), max_tokens: 8 };
      trials.push({ req, s: generate(h.nc, OVER, req) });
    }
    await Promise.all(trials.map((t) => t.s.waitFinal(10000, "the final ERR_OVERLOADED")));
    const p = [];
    for (const t of trials) {
      if (t.s.final.error_code !== 7) {
        p.push(`${t.req.request_id}: the first answer must be ERR_OVERLOADED (7) (selects saw ` +
          `every worker busy: ${confirmed}), got ${t.s.final.error_code}`);
      }
      t.answered = Date.now();
      t.seen = t.s.msgs.length;
      publishGenerate(h.nc, OVER, t.s); // crossed the answer: ignored
      publishGenerate(h.nc, OVER, t.s);
      // a retry at once under a new request_id, same inbox and prompt: a new request
      t.retryId = `${t.req.request_id}-2`;
      publishGenerate(h.nc, OVER, { inbox: t.s.inbox,
        bytes: encode("GenerateRequest", { ...t.req, request_id: t.retryId }) });
    }
    await sleep(1500);
    const ofRetry = (t, m) => m.chunk && m.chunk.request_id === t.retryId;
    for (const t of trials) {
      const more = t.s.msgs.slice(t.seen);
      const crossing = more.filter((m) => !ofRetry(t, m));
      if (crossing.length) {
        p.push(`${t.req.request_id}: resends within 3 s of the error must be ignored, got ` +
          `${crossing.length} message(s): ${t.s.summary()}`);
      }
      // the retry waits in the queue (the worker is still busy), then is answered: 400 ms
      const finals = more.filter((m) => ofRetry(t, m) && m.chunk.final);
      if (finals.length !== 1) {
        p.push(`${t.retryId}: a retry under a new request_id is a new request and must be ` +
          `answered once within 1.5 s, got ${finals.length} final(s): ${t.s.summary()}`);
      }
      t.seen = t.s.msgs.length;
    }
    await sleep(2000); // 3.5 s after the answers
    for (const t of trials) {
      t.seen = t.s.msgs.length;
      publishGenerate(h.nc, OVER, t.s); // a new attempt: it waits, then is answered again
    }
    await Promise.all(trials.map((t) => t.s.waitFor((x) => x.msgs.length > t.seen, 10000,
      "an answer to the new attempt").catch(() => {})));
    for (const t of trials) {
      const more = t.s.chunks.slice(t.seen);
      if (!more.some((c) => c.final)) {
        p.push(`${t.req.request_id}: a request sent 3 s after its error is a new attempt and ` +
          `must be answered, got: ${t.s.summary()}`);
      }
    }
    assert.ok(p.length === 0, p.slice(0, 4).join("\n"));
  } finally {
    await releaseFillers(h.nc, OVER, fillers);
  }
});
