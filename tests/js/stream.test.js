// A request and its stream; select, then forward (docs/protocol.md "A request and its stream",
// "Select, then forward").
import { test } from "node:test";
import assert from "node:assert/strict";
import { createInbox } from "@nats-io/transport-node";
import { T, useFleet } from "./lib/setup.js";
import { encode, decode } from "./lib/proto.js";
import {
  Stream, generate, select, prompt, freshSeed, rid, streamProblems, problemsMessage, sleep,
} from "./lib/client.js";

const NS = "strm";
const ROUTERS = ["strm-r1", "strm-r2"];
const WORKERS = [201, 202];
const h = useFleet("stream", [{ ns: NS, routers: ROUTERS, workers: WORKERS }]);

function assertGoodStream(s, req, extra = {}) {
  const problems = streamProblems(s, { requestId: req.request_id, maxTokens: req.max_tokens, ...extra });
  const f = s.final;
  if (f) {
    if (f.error_code !== 0) problems.push(`the final chunk's error_code must be 0 (OK), got ${f.error_code} ("${f.error}")`);
    if (f.finish_reason !== "length") problems.push(`finish_reason must be "length" (max_tokens generated), got "${f.finish_reason}"`);
  }
  assert.ok(problems.length === 0, problemsMessage("a complete stream, as the contract has it", problems, s));
}

test("streaming: positions 0,1,2,... one final 'length', one worker, max_tokens tokens", T, async () => {
  const req = { request_id: rid("stream"), token_ids: prompt(300, freshSeed()), max_tokens: 24 };
  const s = generate(h.nc, NS, req);
  await s.complete(20000, 400);
  s.close();
  assertGoodStream(s, req);
  const chunks = s.chunks;
  // the simulated worker sends one token per chunk: positions 0, 1, 2, ... exactly
  const positions = chunks.filter((c) => !c.final).map((c) => c.position);
  const expected = [];
  let n = 0;
  for (const c of chunks.filter((x) => !x.final)) { expected.push(n); n += c.token_ids.length; }
  assert.deepEqual(positions, expected, "positions count the tokens before each chunk");
  assert.equal(s.final.position, n, "the final chunk's position is the stream's total before it");
  assert.ok(WORKERS.map(String).includes(chunks[0].worker_id),
    `worker_id names a worker of the fleet (${WORKERS}), got ${chunks[0].worker_id}`);
  assert.equal(chunks[0].cached_tokens, 0, "a fresh random prompt: nothing cached (first chunk)");
  assert.equal(s.final.cached_tokens, chunks[0].cached_tokens,
    "cached_tokens is on the first chunk and again on the final");
  assert.ok(s.msgs.every((m) => !m.errCode), "a good stream carries no Nats-Service-Error-Code");
});

test("prefix cache: a second request sharing the prompt's prefix gets cached_tokens > 0", T, async () => {
  const prefix = prompt(640, freshSeed()); // 10 blocks of 64
  const first = { request_id: rid("prefix1"), token_ids: [...prefix, ...prompt(64, freshSeed())], max_tokens: 4 };
  const s1 = generate(h.nc, NS, first);
  await s1.complete(20000, 200);
  s1.close();
  assertGoodStream(s1, first);
  const second = { request_id: rid("prefix2"), token_ids: [...prefix, ...prompt(64, freshSeed())], max_tokens: 4 };
  // the first request's KV events reach the routers within milliseconds; give them 300 ms
  await sleep(300);
  const s2 = generate(h.nc, NS, second);
  await s2.complete(20000, 200);
  s2.close();
  assertGoodStream(s2, second);
  const c1 = s2.chunks[0];
  assert.ok(c1.cached_tokens > 0, `the second request shares a 640-token prefix with the first, ` +
    `its first chunk must report cached_tokens > 0: ${s2.summary()}`);
  assert.ok(c1.cached_tokens <= prefix.length, `cached_tokens (${c1.cached_tokens}) is at most the ` +
    `shared prefix (${prefix.length})`);
  assert.equal(s2.final.cached_tokens, c1.cached_tokens, "cached_tokens again on the final chunk");
});

test("select, unbooked: a decision, request_key 0, router_id and candidates", T, async () => {
  const req = { request_id: rid("sel"), token_ids: prompt(200, freshSeed()), max_tokens: 8 };
  const { resp } = await select(h.nc, NS, req, false);
  assert.equal(resp.error_code, 0, `select without error: ${JSON.stringify(resp)}`);
  assert.equal(resp.request_key, "0", "book = false: request_key is 0 (nothing booked)");
  assert.ok(ROUTERS.includes(resp.router_id), `router_id names the router that answered ` +
    `(${ROUTERS}), got "${resp.router_id}"`);
  assert.ok(WORKERS.map(String).includes(resp.worker_id), `worker_id is a fleet worker, got ${resp.worker_id}`);
  const cands = resp.candidates.map((c) => c.worker_id).sort();
  assert.deepEqual(cands, WORKERS.map(String).sort(), "the candidates weighed: every worker");
  assert.ok(cands.includes(resp.worker_id), "the chosen worker is a candidate");
  assert.equal(resp.policy, "kv", "the default policy is kv");
  const chosen = resp.candidates.find((c) => c.worker_id === resp.worker_id);
  assert.equal(resp.overlap_blocks, chosen.overlap_blocks, "overlap_blocks is the chosen candidate's");
});

test("select, booked, then forwarding a WorkerGenerate to kv.<ns>.worker.<wid>.generate", T, async () => {
  const req = { request_id: rid("book"), token_ids: prompt(200, freshSeed()), max_tokens: 12 };
  const { resp } = await select(h.nc, NS, req, true);
  assert.equal(resp.error_code, 0, `booked select without error: ${JSON.stringify(resp)}`);
  assert.notEqual(resp.request_key, "0", "book = true: a non-zero request_key");
  assert.ok(ROUTERS.includes(resp.router_id), `router_id set, got "${resp.router_id}"`);
  const s = new Stream(h.nc);
  s.request = req;
  h.nc.publish(`kv.${NS}.worker.${resp.worker_id}.generate`, encode("WorkerGenerate", {
    request: req, request_key: resp.request_key, overlap_blocks: resp.overlap_blocks,
  }), { reply: s.inbox });
  await s.complete(20000, 300);
  s.close();
  assertGoodStream(s, req, { workerId: resp.worker_id });
});

test("select, booking the same request (reply subject and id) twice: ERR_DUPLICATE (10)", T, async () => {
  const req = { request_id: rid("dup"), token_ids: prompt(200, freshSeed()), max_tokens: 8 };
  const inbox = createInbox();
  const answers = [];
  const sub = h.nc.subscribe(inbox, { callback: (err, m) => { if (!err) answers.push(m); } });
  const bytes = encode("SelectRequest", { request: req, book: true });
  try {
    h.nc.publish(`kv.${NS}.select`, bytes, { reply: inbox });
    const until = async (n) => {
      for (let i = 0; i < 200 && answers.length < n; i++) await sleep(25);
      assert.ok(answers.length >= n, `${n} select answers on ${inbox}, got ${answers.length}`);
    };
    await until(1);
    const a = decode("SelectResponse", answers[0].data);
    assert.equal(a.error_code, 0, `the first booking succeeds: ${JSON.stringify(a)}`);
    assert.notEqual(a.request_key, "0");
    await sleep(100); // the booking reaches the other router (gossip: milliseconds)
    h.nc.publish(`kv.${NS}.select`, bytes, { reply: inbox });
    await until(2);
    const b = decode("SelectResponse", answers[1].data);
    assert.equal(b.error_code, 10, `the same request booked again must be ERR_DUPLICATE (10), ` +
      `got ${b.error_code} "${b.error}": ${JSON.stringify(b)}`);
    assert.ok(b.error.length > 0, "the error has its text");
    assert.equal(b.request_key, "0", "no second booking: request_key 0");
  } finally {
    sub.unsubscribe();
  }
});

test("two requests with the same id on different inboxes are two requests", T, async () => {
  const id = rid("same-id");
  const reqA = { request_id: id, token_ids: prompt(100, freshSeed()), max_tokens: 6 };
  const reqB = { request_id: id, token_ids: prompt(100, freshSeed()), max_tokens: 9 };
  const a = generate(h.nc, NS, reqA);
  const b = generate(h.nc, NS, reqB);
  await Promise.all([a.complete(20000, 300), b.complete(20000, 300)]);
  a.close();
  b.close();
  assertGoodStream(a, reqA);
  assertGoodStream(b, reqB);
});
