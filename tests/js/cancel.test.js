// Cancelling and deadlines (docs/protocol.md "Cancelling", "Deadlines").
import { test } from "node:test";
import assert from "node:assert/strict";
import { T, useFleet } from "./lib/setup.js";
import {
  Stream, generate, cancel, prompt, freshSeed, rid, streamProblems, problemsMessage, sleep, ERR_HEADER,
} from "./lib/client.js";
import { BUSY_ROUTER_ARGS, BUSY_WORKER_ARGS, fillWorkers, releaseFillers } from "./lib/busy.js";

const NS = "canc";
const BUSY = "cbusy";
const h = useFleet("cancel", [
  { ns: NS, routers: ["canc-r1", "canc-r2"], workers: [301, 302] },
  { ns: BUSY, routers: ["cbusy-r1", "cbusy-r2"], workers: [311, 312],
    routerArgs: BUSY_ROUTER_ARGS, workerArgs: BUSY_WORKER_ARGS },
]);

const ERR_CANCELLED = 25;
const ERR_DEADLINE = 26;

// The problems of a stream that must have ended early with `code`: one final chunk, last, with
// that code, its position the tokens sent before it, and (for a cancel) "cancelled".
function endedProblems(s, req, code, reason) {
  const p = streamProblems(s, { requestId: req.request_id });
  const f = s.final;
  if (!f) return p;
  if (f.error_code !== code) p.push(`the final chunk's error_code must be ${code}, got ${f.error_code} ("${f.error}")`);
  if (reason !== undefined && f.finish_reason !== reason) p.push(`finish_reason must be "${reason}", got "${f.finish_reason}"`);
  let before = 0;
  for (const c of s.chunks) if (!c.final) before += c.token_ids.length;
  if (f.position !== before) p.push(`the final chunk's position must be the tokens sent before it (${before}), got ${f.position}`);
  const fm = s.msgs.find((m) => m.chunk && m.chunk.final);
  if (fm && fm.errCode !== String(code)) {
    p.push(`errors carry the header ${ERR_HEADER}: ${code} on the final chunk, got "${fm.errCode || ""}"`);
  }
  return p;
}

test("cancel mid-stream: one final ERR_CANCELLED (25), 'cancelled', position = tokens received, then nothing", T, async () => {
  const req = { request_id: rid("cancel"), token_ids: prompt(200, freshSeed()), max_tokens: 3000 };
  const s = generate(h.nc, NS, req);
  await s.waitChunks(5, 15000);
  cancel(h.nc, NS, req.request_id, s.inbox);
  await s.waitFinal(10000, "the final chunk after the cancel");
  await sleep(500);
  cancel(h.nc, NS, req.request_id, s.inbox); // idempotent: a second cancel changes nothing
  await sleep(400);
  s.close();
  const p = endedProblems(s, req, ERR_CANCELLED, "cancelled");
  if (s.final && s.final.position >= req.max_tokens) p.push("the request ran to its end: the cancel did not stop it");
  assert.ok(p.length === 0, problemsMessage("a cancel mid-stream", p, s));
});

test("cancel of a finished request: nothing more is sent", T, async () => {
  const req = { request_id: rid("cancel-done"), token_ids: prompt(100, freshSeed()), max_tokens: 4 };
  const s = generate(h.nc, NS, req);
  await s.waitFinal(15000);
  const n = s.msgs.length;
  cancel(h.nc, NS, req.request_id, s.inbox);
  await sleep(600);
  s.close();
  assert.equal(s.msgs.length, n, `a cancel after the final chunk must send nothing: ${s.summary()}`);
  assert.equal(s.final.error_code, 0, `it had finished: ${s.summary()}`);
});

test("cancel before the generate is sent: the generate is answered cancelled at once", T, async () => {
  const req = { request_id: rid("precancel"), token_ids: prompt(100, freshSeed()), max_tokens: 200 };
  const s = new Stream(h.nc);
  cancel(h.nc, NS, req.request_id, s.inbox);
  await sleep(200); // the cancel reaches every router first
  generate(h.nc, NS, req, { stream: s });
  await s.waitFinal(10000, "the final ERR_CANCELLED chunk for a request cancelled before it came");
  await sleep(500);
  s.close();
  const p = endedProblems(s, req, ERR_CANCELLED, "cancelled");
  if (s.chunks.length !== 1) p.push(`a request cancelled before it came is answered with one chunk, the final, got ${s.chunks.length}`);
  if (s.final && s.final.position !== 0) p.push(`no token was sent: position 0, got ${s.final.position}`);
  assert.ok(p.length === 0, problemsMessage("a cancel that overtook its generate", p, s));
});

test("cancel while queued: the router takes it out, one final ERR_CANCELLED, no token", T, async () => {
  const { fillers, confirmed } = await fillWorkers(h.nc, BUSY, 2);
  const req = { request_id: rid("cancel-queued"), token_ids: prompt(32, freshSeed()), max_tokens: 8 };
  let s;
  try {
    s = generate(h.nc, BUSY, req);
    await sleep(500);
    assert.equal(s.msgs.length, 0, `precondition (the test's set-up): with every worker busy ` +
      `(selects confirmed it: ${confirmed}) the request must still be waiting, but it got: ${s.summary()}`);
    cancel(h.nc, BUSY, req.request_id, s.inbox);
    await s.waitFinal(10000, "the final ERR_CANCELLED chunk of the queued request");
    await sleep(500);
  } finally {
    await releaseFillers(h.nc, BUSY, fillers);
  }
  await sleep(300);
  s.close();
  const p = endedProblems(s, req, ERR_CANCELLED, "cancelled");
  if (s.chunks.length !== 1) p.push(`a queued request that is cancelled gets exactly one chunk, the final, got ${s.chunks.length}`);
  assert.ok(p.length === 0, problemsMessage("a cancel of a queued request", p, s));
});

// The contract: the deadline runs from the first router's receipt (after the publish) and the
// stream "never ends earlier than that". A lower bound only: a slow machine makes it later, never
// earlier.
function tooEarly(s, req, t0) {
  const fm = s.msgs.find((m) => m.chunk && m.chunk.final);
  if (!fm || fm.t - t0 >= req.deadline_ms) return [];
  return [`the final chunk came ${fm.t - t0} ms after the publish, before deadline_ms ` +
    `(${req.deadline_ms}): a deadline never ends a request earlier`];
}

test("deadline_ms while generating: one final ERR_DEADLINE (26), position = tokens received", T, async () => {
  // 1 s: at the simulated worker's real-time pace the stream is well under way by then, and
  // 3000 tokens are far from done
  const req = { request_id: rid("deadline"), token_ids: prompt(200, freshSeed()), max_tokens: 3000,
    deadline_ms: 1000 };
  const t0 = Date.now();
  const s = generate(h.nc, NS, req);
  await s.waitFinal(10000, "the final chunk after the deadline (1000 ms)");
  await sleep(500);
  s.close();
  const p = endedProblems(s, req, ERR_DEADLINE);
  if (s.final && s.final.position >= req.max_tokens) p.push("the request ran to its end: the deadline did not stop it");
  if (!s.chunks.some((c) => !c.final && c.token_ids.length > 0)) {
    p.push("no token came before the final chunk: the deadline did not end a request that was generating");
  }
  p.push(...tooEarly(s, req, t0));
  assert.ok(p.length === 0, problemsMessage("deadline_ms 1000 on a 3000-token request", p, s));
});

test("deadline_ms while queued: one final ERR_DEADLINE (26), no token", T, async () => {
  const { fillers, confirmed } = await fillWorkers(h.nc, BUSY, 2);
  const req = { request_id: rid("deadline-queued"), token_ids: prompt(32, freshSeed()), max_tokens: 8,
    deadline_ms: 600 };
  let s;
  const t0 = Date.now();
  try {
    s = generate(h.nc, BUSY, req);
    await s.waitFinal(10000, `the final ERR_DEADLINE chunk of a request queued past its deadline ` +
      `(every worker busy; selects confirmed it: ${confirmed})`);
    await sleep(300);
  } finally {
    await releaseFillers(h.nc, BUSY, fillers);
  }
  await sleep(300);
  s.close();
  const p = endedProblems(s, req, ERR_DEADLINE);
  if (s.chunks.length !== 1) p.push(`a request that waited past its deadline gets exactly one chunk, the final, got ${s.chunks.length}`);
  p.push(...tooEarly(s, req, t0));
  assert.ok(p.length === 0, problemsMessage("deadline_ms 600 while queued", p, s));
});

test("deadline_ms while queued behind a request without one: its final comes at its deadline, not when the other leaves", T, async () => {
  // fillers of 350 output tokens: they hold the workers far longer than the 600 ms deadline
  const { fillers, confirmed } = await fillWorkers(h.nc, BUSY, 2, 350);
  const head = { request_id: rid("queued-head"), token_ids: prompt(32, freshSeed()), max_tokens: 8 };
  const req = { request_id: rid("deadline-behind"), token_ids: prompt(32, freshSeed()), max_tokens: 8,
    deadline_ms: 600 };
  let a, s;
  let fillersEnded = -1;
  try {
    a = generate(h.nc, BUSY, head);
    await sleep(100);
    s = generate(h.nc, BUSY, req);
    await s.waitFinal(20000, `the final ERR_DEADLINE chunk of a request queued behind another ` +
      `(every worker busy; selects confirmed it: ${confirmed})`);
    fillersEnded = fillers.filter((f) => f.final).length;
    await sleep(300);
  } finally {
    await releaseFillers(h.nc, BUSY, fillers);
    if (a) await a.waitFinal(15000, "the request ahead, once the workers are free").catch(() => {});
  }
  s.close();
  if (a) a.close();
  const p = endedProblems(s, req, ERR_DEADLINE);
  if (s.chunks.length !== 1) p.push(`a request that waited past its deadline gets exactly one chunk, the final, got ${s.chunks.length}`);
  if (fillersEnded !== 0) {
    p.push(`its final came only after ${fillersEnded} of the 2 requests holding the workers ended: ` +
      "it waited for the request ahead of it to leave the queue, past its own deadline");
  }
  assert.ok(p.length === 0, problemsMessage("deadline_ms 600 behind a waiting request", p, s));
});
