// Every error a client can cause (docs/protocol.md "Errors", "Limits", "No router"): one final
// chunk with the code, its text with the figures, and the Nats-Service-Error-Code header.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createInbox, errors as natsErrors } from "@nats-io/transport-node";
import { svc, waitUntil } from "./lib/fleet.js";
import { T, useFleet, limit } from "./lib/setup.js";
import { encode, decode, withUnknownField, codeName, ErrorCode } from "./lib/proto.js";
import {
  Stream, generate, select, prompt, freshSeed, rid, streamProblems, problemsMessage, sleep,
  ERR_HEADER, ERR_TEXT_HEADER,
} from "./lib/client.js";
import { BUSY_WORKER_ARGS, fillWorkers, releaseFillers } from "./lib/busy.js";

const NS = "err";
const EMPTY = "empty"; // routers, no worker
const LOST = "lost"; // a worker of it is killed
const NOBODY = "nobody"; // nothing serves it
const SMALL = "small"; // workers of 64 KV blocks, routers that wait 1 s for a busy one
const h = useFleet("errors", [
  { ns: NS, routers: ["err-r1", "err-r2"], workers: [501, 502] },
  { ns: SMALL, routers: ["small-r1", "small-r2"], workers: [521, 522],
    routerArgs: ["--block-size", "16", "--busy-threshold", "0.5", "--queue-timeout-ms", "1000"],
    workerArgs: BUSY_WORKER_ARGS },
  { ns: EMPTY, routers: ["empty-r1", "empty-r2"], workers: [] },
  { ns: LOST, routers: ["lost-r1", "lost-r2"], workers: [511, 512] },
]);

const ok = (extra = {}) => ({ request_id: rid("err"), token_ids: prompt(50, freshSeed()), max_tokens: 4, ...extra });

// Send a generate (req, or raw bytes) and check that the answer is the contract's error stream:
// exactly one chunk, final, error_code `code`, finish_reason "error", no tokens, worker_id 0
// (a router's), a text holding `texts`, and the service headers.
async function expectError(code, { req, bytes, inbox, ns = NS, texts = [], sameId = true }) {
  const s = new Stream(h.nc, inbox);
  generate(h.nc, ns, req || {}, { stream: s, bytes });
  try {
    await s.waitFinal(10000, `the final chunk with ${codeName(code)} (${code})`);
  } catch (e) {
    s.close();
    throw e;
  }
  await sleep(300);
  s.close();
  const p = [];
  const f = s.final;
  if (s.msgs.length !== 1) p.push(`an error before any token is a stream of exactly one chunk, got ${s.msgs.length} messages`);
  if (f.error_code !== code) p.push(`error_code must be ${code} (${codeName(code)}), got ${f.error_code} (${codeName(f.error_code)}) "${f.error}"`);
  if (f.finish_reason !== "error") p.push(`finish_reason must be "error", got "${f.finish_reason}"`);
  if (f.token_ids.length || f.position !== 0) p.push(`no token: token_ids [] and position 0, got ${f.token_ids.length} tokens at position ${f.position}`);
  if (f.worker_id !== "0") p.push(`a router's error chunk has worker_id 0, got ${f.worker_id}`);
  if (!f.error) p.push("the error has its text (error is empty)");
  for (const t of texts) if (!f.error.includes(t)) p.push(`the error text must state ${t}, got "${f.error}"`);
  if (sameId && req && f.request_id !== req.request_id) p.push(`the chunk carries the request's request_id "${req.request_id}", got "${f.request_id}"`);
  const m = s.msgs.find((x) => x.chunk && x.chunk.final);
  if (m.errCode !== String(f.error_code) || m.errCode !== String(code)) {
    p.push(`header ${ERR_HEADER} must equal error_code ${code}, got "${m.errCode || ""}"`);
  }
  if (!m.errText) p.push(`header ${ERR_TEXT_HEADER} must hold the text, it is missing`);
  assert.ok(p.length === 0, problemsMessage(`${codeName(code)} (${code})`, p, s));
  return s;
}

test("empty prompt: ERR_EMPTY_PROMPT (3)", T, async () => {
  await expectError(3, { req: ok({ token_ids: [] }) });
});

test("prompt over max_prompt_tokens: ERR_PROMPT_TOO_LONG (4), the text names the limit", T, async () => {
  const lim = limit(h, NS, "max_prompt_tokens") ?? 1048576;
  const n = lim + 1;
  await expectError(4, { req: ok({ token_ids: prompt(n, freshSeed()) }), texts: [String(lim), String(n)] });
});

test("unknown policy: ERR_UNKNOWN_POLICY (5)", T, async () => {
  await expectError(5, { req: ok({ overrides: { policy: "no_such_policy" } }) });
});

test("max_tokens 0: ERR_MAX_TOKENS_ZERO (22)", T, async () => {
  await expectError(22, { req: ok({ max_tokens: 0 }) });
});

test("max_tokens over max_output_tokens: ERR_MAX_TOKENS_TOO_LARGE (23), the text names the limit", T, async () => {
  const lim = limit(h, NS, "max_output_tokens") ?? 65536;
  await expectError(23, { req: ok({ max_tokens: lim + 1 }), texts: [String(lim), String(lim + 1)] });
});

test("request_id over 256 bytes: ERR_ID_TOO_LONG (30)", T, async () => {
  await expectError(30, { req: ok({ request_id: "i".repeat(257) }), sameId: false });
  // bytes, not characters: 129 two-byte characters are 258 bytes
  await expectError(30, { req: ok({ request_id: "é".repeat(129) }), sameId: false });
});

test("reply subject over 1024 bytes: ERR_REPLY_TOO_LONG (29)", T, async () => {
  const inbox = `_INBOX.${"r".repeat(1025 - 7)}`;
  assert.equal(Buffer.byteLength(inbox), 1025);
  await expectError(29, { req: ok(), inbox });
});

test("limits are inclusive: a 256-byte request_id and a 1024-byte reply subject are served", T, async () => {
  const req = ok({ request_id: `${rid("max")}-`.padEnd(256, "x") });
  assert.equal(Buffer.byteLength(req.request_id), 256);
  const inbox = `_INBOX.${"m".repeat(1024 - 7)}`;
  const s = generate(h.nc, NS, req, { inbox });
  await s.complete(15000, 300);
  s.close();
  const p = streamProblems(s, { requestId: req.request_id, maxTokens: req.max_tokens });
  if (s.final && s.final.error_code !== 0) p.push(`it must be served (error_code 0), got ${s.final.error_code} "${s.final.error}"`);
  assert.ok(p.length === 0, problemsMessage("a request at the id and reply limits", p, s));
});

test("a request_id holding a NUL byte: ERR_INVALID (2), generate and select", T, async () => {
  await expectError(2, { req: ok({ request_id: `${rid("nul")}\u0000tail` }), texts: ["NUL"], sameId: false });
  const { resp } = await select(h.nc, NS, ok({ request_id: `${rid("nul")}\u0000tail` }), true);
  assert.equal(resp.error_code, 2, `select: ERR_INVALID (2), got ${resp.error_code} "${resp.error}"`);
  assert.ok(resp.error.includes("NUL"), `the text says why, got "${resp.error}"`);
  assert.equal(resp.request_key, "0", "nothing booked");
});

test("override out of range: ERR_BAD_OVERRIDE (31)", T, async () => {
  await expectError(31, { req: ok({ overrides: { has_overlap_weight: true, overlap_weight: -1 } }) });
  await expectError(31, { req: ok({ overrides: { has_temperature: true, temperature: 2e6 } }) });
  await expectError(31, { req: ok({ overrides: { has_overlap_weight: true, overlap_weight: 1e6 + 1 } }) });
});

test("an override counts only when its has_ flag is set", T, async () => {
  const req = ok({ overrides: { has_overlap_weight: false, overlap_weight: -1, temperature: -5 } });
  const s = generate(h.nc, NS, req);
  await s.complete(15000, 300);
  s.close();
  const p = streamProblems(s, { requestId: req.request_id, maxTokens: req.max_tokens });
  if (s.final && s.final.error_code !== 0) p.push(`values without their has_ flag are ignored: error_code 0, got ${s.final.error_code} "${s.final.error}"`);
  assert.ok(p.length === 0, problemsMessage("overrides without has_ flags", p, s));
});

test("malformed payload: ERR_MALFORMED (15)", T, async () => {
  // field 1 (request_id) says 5 bytes follow, one does
  await expectError(15, { bytes: new Uint8Array([0x0a, 0x05, 0x61]), sameId: false });
  // not protobuf at all
  await expectError(15, { bytes: new TextEncoder().encode("{\"request_id\": \"json\"}\xff"), sameId: false });
});

function varintLen(n) {
  let l = 1;
  while (n >= 128) { n = Math.floor(n / 128); l++; }
  return l;
}

test("request over max_request_bytes: ERR_TOO_LARGE (16), the text states both figures", T, async () => {
  const maxPayload = h.nc.info.max_payload;
  const lim = limit(h, NS, "max_request_bytes");
  // one byte over the announced limit; without the announcement, the server's max_payload
  // itself (a forward always adds its envelope, so it cannot carry that)
  const size = lim !== null ? lim + 1 : maxPayload;
  assert.ok(size <= maxPayload, `max_request_bytes (${lim}) must be below the server's max_payload (${maxPayload})`);
  const req = ok();
  const base = encode("GenerateRequest", req);
  const field = 1000; // unknown to GenerateRequest: still a valid message, only larger
  let len = size - base.length - varintLen((field << 3) | 2);
  len -= varintLen(len);
  if (base.length + varintLen((field << 3) | 2) + varintLen(len) + len !== size) len += 1;
  const bytes = withUnknownField(base, field, len);
  assert.equal(bytes.length, size, "the test's own message size");
  const texts = [String(size)];
  if (lim !== null) texts.push(String(lim));
  await expectError(16, { req, bytes, texts, sameId: false });
});

test("a request of exactly max_request_bytes is served (its forward can carry it)", T, async () => {
  const lim = limit(h, NS, "max_request_bytes");
  assert.ok(lim !== null, "the routers' $SRV.INFO metadata announces max_request_bytes");
  const req = ok();
  const base = encode("GenerateRequest", req);
  const field = 1000;
  let len = lim - base.length - varintLen((field << 3) | 2);
  len -= varintLen(len);
  if (base.length + varintLen((field << 3) | 2) + varintLen(len) + len !== lim) len += 1;
  const bytes = withUnknownField(base, field, len);
  assert.equal(bytes.length, lim, "the test's own message size");
  const s = generate(h.nc, NS, req, { bytes });
  await s.complete(15000, 300);
  s.close();
  const p = streamProblems(s, { requestId: req.request_id, maxTokens: req.max_tokens });
  if (s.final && s.final.error_code !== 0) p.push(`a request of max_request_bytes (${lim}) bytes must be served, got ${s.final.error_code} (${codeName(s.final.error_code)}) "${s.final.error}"`);
  assert.ok(p.length === 0, problemsMessage(`a request of exactly max_request_bytes (${lim})`, p, s));
});

test("select errors come in SelectResponse.error_code, with the same codes", T, async () => {
  const cases = [
    [3, encode("SelectRequest", { request: ok({ token_ids: [] }) })],
    [22, encode("SelectRequest", { request: ok({ max_tokens: 0 }) })],
    [5, encode("SelectRequest", { request: ok({ overrides: { policy: "no_such_policy" } }) })],
    [15, new Uint8Array([0x0a, 0x05, 0x61])],
  ];
  for (const [code, bytes] of cases) {
    const m = await h.nc.request(`kv.${NS}.select`, bytes, { timeout: 5000 });
    const r = decode("SelectResponse", m.data);
    assert.equal(r.error_code, code, `select: error_code ${code} (${codeName(code)}), got ${r.error_code} "${r.error}"`);
    assert.ok(r.error.length > 0, `select ${codeName(code)}: the error has its text`);
  }
});

test("no workers: ERR_NO_WORKERS (6), on generate and on select", T, async () => {
  await expectError(6, { ns: EMPTY, req: ok() });
  const { resp } = await select(h.nc, EMPTY, ok(), false);
  assert.equal(resp.error_code, 6, `select with no worker: ERR_NO_WORKERS (6), got ${resp.error_code} "${resp.error}"`);
});

test("every worker busy past the queue timeout: ERR_OVERLOADED (7), from the router", T, async () => {
  // fillers of 640 prompt and 350 output tokens: 62 of the 64 blocks at their end, so they fit
  const { fillers, confirmed } = await fillWorkers(h.nc, SMALL, 2, 350);
  let s;
  try {
    assert.ok(confirmed, "precondition (the test's set-up): selects see every worker busy");
    s = await expectError(7, { ns: SMALL, req: ok() });
  } finally {
    await releaseFillers(h.nc, SMALL, fillers);
  }
});

test("a request its worker could never hold: ERR_FULL (13), from the worker, the text names the figures", T, async () => {
  // 1,000 prompt and 100 output tokens: 69 blocks of 16, on workers of 64
  const req = ok({ token_ids: prompt(1000, freshSeed()), max_tokens: 100 });
  const s = generate(h.nc, SMALL, req);
  await s.waitFinal(10000, "the final ERR_FULL chunk");
  await sleep(300);
  s.close();
  const p = streamProblems(s, { requestId: req.request_id });
  const f = s.final;
  if (f) {
    if (f.error_code !== 13) p.push(`error_code must be 13 (ERR_FULL), got ${f.error_code} "${f.error}"`);
    if (s.chunks.length !== 1) p.push(`a request refused before any token gets one chunk, got ${s.chunks.length}`);
    if (!["521", "522"].includes(f.worker_id)) p.push(`the worker refuses it: worker_id 521 or 522, got ${f.worker_id}`);
    if (!f.error.includes("69")) p.push(`the text states the blocks needed (69), got "${f.error}"`);
    const m = s.msgs.find((x) => x.chunk && x.chunk.final);
    if (m.errCode !== "13") p.push(`header ${ERR_HEADER} must be 13, got "${m.errCode || ""}"`);
  }
  assert.ok(p.length === 0, problemsMessage("a request over its worker's KV pool", p, s));
});

test("worker lost: kill -9 the worker mid-stream, the final ERR_WORKER_LOST (17) names it", T, async (t) => {
  const req = { request_id: rid("lost"), token_ids: prompt(200, freshSeed()), max_tokens: 3000 };
  const s = generate(h.nc, LOST, req);
  await s.waitChunks(5, 15000);
  const wid = s.chunks[0].worker_id;
  const entry = h.fleet.procs.find((p) => p.name === `kvworker-${LOST}-${wid}`);
  assert.ok(entry, `the stream's worker_id (${wid}) is one of the workers started (511, 512)`);
  const t0 = Date.now();
  await h.fleet.kill(entry, "SIGKILL");
  await s.waitFinal(12000, `the final ERR_WORKER_LOST chunk after worker ${wid} was killed (the ` +
    `contract: detected within 2 s)`);
  const elapsed = Date.now() - t0;
  await sleep(500);
  s.close();
  t.diagnostic(`the final chunk came ${elapsed} ms after the kill`);
  // The router sends this final chunk, and tokens went from the worker to the client directly:
  // it may not know how many came. A position at most the tokens received reads as a repeat by
  // the client's rules (nothing appended); one past them would be a gap, which is wrong.
  const token = s.chunks.filter((c) => !c.final);
  const p = streamProblems(s, { requestId: req.request_id, workerId: wid, finalMayRepeat: true });
  const f = s.final;
  if (f.error_code !== 17) p.push(`error_code must be 17 (ERR_WORKER_LOST), got ${f.error_code} "${f.error}"`);
  if (f.worker_id !== wid) p.push(`the final chunk names the worker that died (${wid}), got ${f.worker_id}`);
  if (f.request_id !== req.request_id) p.push(`the final chunk carries request_id "${req.request_id}", got "${f.request_id}"`);
  let before = 0;
  for (const c of token) before += c.token_ids.length;
  if (f.position > before) p.push(`the final chunk's position (${f.position}) is past the tokens sent (${before}): a gap`);
  if (f.position !== before) t.diagnostic(`the final chunk's position is ${f.position}, ${before} tokens came before it`);
  const m = s.msgs.find((x) => x.chunk && x.chunk.final);
  if (m.errCode !== "17") p.push(`header ${ERR_HEADER} must be 17, got "${m.errCode || ""}"`);
  assert.ok(p.length === 0, problemsMessage("a stream whose worker died", p, s));
});

test("no router: request() rejects with no responders; a raw publish gets an empty 503 message", T, async () => {
  const bytes = encode("GenerateRequest", ok());
  for (const subj of [`kv.${NOBODY}.generate`, `kv.${NOBODY}.select`]) {
    let err = null;
    try {
      await h.nc.request(subj, bytes, { timeout: 5000 });
    } catch (e) {
      err = e;
    }
    assert.ok(err, `request() to ${subj}, which nobody serves, must reject`);
    const noResp = err instanceof natsErrors.NoRespondersError ||
      err.cause instanceof natsErrors.NoRespondersError ||
      (typeof err.isNoResponders === "function" && err.isNoResponders());
    assert.ok(noResp, `request() to ${subj} rejects with "no responders", not a timeout: ${err}`);
  }
  const s = new Stream(h.nc, createInbox());
  h.nc.publish(`kv.${NOBODY}.generate`, bytes, { reply: s.inbox });
  await s.waitFor((x) => x.msgs.length > 0, 5000, "the server's no-responders message");
  await sleep(300);
  s.close();
  assert.equal(s.msgs.length, 1, `one message: ${s.summary()}`);
  const m = s.msgs[0];
  assert.equal(m.size, 0, "the no-responders message has an empty payload");
  assert.equal(m.status, 503, "with the header status 503");
  assert.equal(m.chunk, null, "it is no GenerateResponse: the client checks the status first");
});

// errors_by_code[code] summed over the routers of namespace ns, endpoint generate (keys may be
// the number or the ERR_ name), plus num_errors.
async function errorCounts(ns) {
  const stats = await svc(h.nc, "stats", "kvrouter");
  const c = { total: 0, byCode: {} };
  for (const r of stats) {
    for (const e of r.endpoints || []) {
      if (e.subject !== `kv.${ns}.generate`) continue;
      c.total += e.num_errors || 0;
      for (const [k, v] of Object.entries(e.errors_by_code || {})) {
        const code = /^\d+$/.test(k) ? Number(k) : ErrorCode[k.replace(/^KVR_/, "")];
        c.byCode[code] = (c.byCode[code] || 0) + v;
      }
    }
  }
  return c;
}

test("errors are counted in $SRV.STATS (errors_by_code), ERR_NO_REPLY (24) too", T, async () => {
  const before = await errorCounts(NS);
  await expectError(3, { req: ok({ token_ids: [] }) });
  h.nc.publish(`kv.${NS}.generate`, encode("GenerateRequest", ok())); // no reply subject
  let now;
  try {
    await waitUntil(async () => {
      now = await errorCounts(NS);
      return (now.byCode[3] || 0) > (before.byCode[3] || 0) && (now.byCode[24] || 0) > (before.byCode[24] || 0) &&
        now.total >= before.total + 2;
    }, 10000, "the routers' STATS to count ERR_EMPTY_PROMPT and ERR_NO_REPLY");
  } catch (e) {
    assert.fail(`after one ERR_EMPTY_PROMPT and one generate without a reply subject, errors_by_code ` +
      `must count 3 and 24 once more each and num_errors 2 more: before ${JSON.stringify(before)}, ` +
      `after ${JSON.stringify(now)} (${e.message})`);
  }
});
