// Discovery through the NATS service API (docs/protocol.md "Discovery"), with the services client.
import { test } from "node:test";
import assert from "node:assert/strict";
import { svc, waitUntil, MANY } from "./lib/fleet.js";
import { T, useFleet } from "./lib/setup.js";
import { generate, prompt, freshSeed, rid } from "./lib/client.js";

const NS = "disc";
const ROUTERS = ["disc-r1", "disc-r2"];
const WORKERS = [101, 102];
const h = useFleet("discovery", [{ ns: NS, routers: ROUTERS, workers: WORKERS }]);

const DIGITS = /^\d+$/;
const ROUTER_META = ["router_id", "namespace", "prefix", "block_size", "max_prompt_tokens",
  "max_output_tokens", "max_request_bytes", "max_request_id_bytes", "max_reply_bytes"];

function show(x) {
  return JSON.stringify(x, null, 0).slice(0, 1500);
}

test("ping: both routers answer as service kvrouter, both workers as kvworker", T, async () => {
  const routers = await svc(h.nc, "ping", "kvrouter");
  const workers = await svc(h.nc, "ping", "kvworker");
  assert.equal(routers.length, 2, `2 routers started, $SRV.PING.kvrouter answers: ${show(routers)}`);
  assert.equal(workers.length, 2, `2 workers started, $SRV.PING.kvworker answers: ${show(workers)}`);
  for (const r of [...routers, ...workers]) {
    assert.equal(r.type, "io.nats.micro.v1.ping_response", `PING type (ADR-32): ${show(r)}`);
    assert.ok(typeof r.id === "string" && r.id.length > 0, `PING id must be a string: ${show(r)}`);
    assert.ok(typeof r.version === "string" && r.version.length > 0, `PING version: ${show(r)}`);
  }
  assert.deepEqual(routers.map((r) => r.name), ["kvrouter", "kvrouter"]);
  assert.deepEqual(workers.map((r) => r.name), ["kvworker", "kvworker"]);
  const ids = new Set([...routers, ...workers].map((r) => r.id));
  assert.equal(ids.size, 4, "every service instance has its own id");
  // The whole $SRV.PING finds all four as well.
  const all = await svc(h.nc, "ping", "");
  assert.equal(all.length, 4, `$SRV.PING (every service): ${show(all)}`);
});

test("info: routers' endpoints and metadata (router_id, namespace, block_size, limits)", T, async () => {
  const infos = await svc(h.nc, "info", "kvrouter");
  assert.equal(infos.length, 2, `2 routers' INFO: ${show(infos)}`);
  const seenIds = [];
  for (const i of infos) {
    assert.equal(i.type, "io.nats.micro.v1.info_response", `INFO type: ${show(i)}`);
    assert.equal(i.name, "kvrouter");
    assert.ok(i.metadata && typeof i.metadata === "object", `INFO must have metadata: ${show(i)}`);
    const missing = ROUTER_META.filter((k) => !(k in i.metadata));
    assert.deepEqual(missing, [], `router INFO metadata must hold ${ROUTER_META.join(", ")}; ` +
      `missing ${missing.join(", ")} in ${show(i.metadata)}`);
    for (const [k, v] of Object.entries(i.metadata)) {
      assert.equal(typeof v, "string", `metadata values are strings (ADR-32): ${k} = ${show(v)}`);
    }
    const m = i.metadata;
    seenIds.push(m.router_id);
    assert.equal(m.namespace, NS, "metadata namespace is the fleet's --namespace");
    assert.equal(m.prefix, "kv", "metadata prefix is the default kv");
    assert.equal(m.block_size, "64", "metadata block_size is the default 64");
    assert.equal(m.max_prompt_tokens, "1048576", "default --max-prompt-tokens, 1,048,576");
    assert.equal(m.max_output_tokens, "65536", "default --max-output-tokens, 65,536");
    assert.equal(m.max_request_id_bytes, "256", "request_id limit, 256 bytes");
    assert.equal(m.max_reply_bytes, "1024", "reply subject limit, 1024 bytes");
    assert.match(m.max_request_bytes, DIGITS, "max_request_bytes is a decimal number");
    const maxPayload = h.nc.info.max_payload;
    const mrb = Number(m.max_request_bytes);
    assert.ok(mrb > 0 && mrb < maxPayload, `max_request_bytes (${mrb}) is the server's ` +
      `max_payload (${maxPayload}) less the forward's envelope, so below it`);
    assert.ok(mrb > maxPayload / 2, `max_request_bytes (${mrb}) is max_payload (${maxPayload}) ` +
      `less an envelope, not a fraction of it`);
    const eps = Object.fromEntries((i.endpoints || []).map((e) => [e.name, e]));
    assert.deepEqual(Object.keys(eps).sort(), ["generate", "select"],
      `router endpoints generate and select: ${show(i.endpoints)}`);
    assert.equal(eps.generate.subject, `kv.${NS}.generate`);
    assert.equal(eps.select.subject, `kv.${NS}.select`);
    assert.equal(eps.generate.queue_group, "kvrouter", "generate's queue group is kvrouter");
    assert.equal(eps.select.queue_group, "kvrouter", "select's queue group is kvrouter");
  }
  assert.deepEqual(seenIds.sort(), [...ROUTERS].sort(), "metadata router_id is each --id");
});

test("info: workers' endpoint and worker_id", T, async () => {
  const infos = await svc(h.nc, "info", "kvworker");
  assert.equal(infos.length, 2, `2 workers' INFO: ${show(infos)}`);
  const wids = [];
  for (const i of infos) {
    assert.equal(i.type, "io.nats.micro.v1.info_response");
    assert.equal(i.name, "kvworker");
    const wid = i.metadata && i.metadata.worker_id;
    assert.match(String(wid), DIGITS, `worker INFO metadata worker_id: ${show(i.metadata)}`);
    wids.push(Number(wid));
    const gen = (i.endpoints || []).find((e) => e.name === "generate");
    assert.ok(gen, `a worker's endpoint generate: ${show(i.endpoints)}`);
    assert.equal(gen.subject, `kv.${NS}.worker.${wid}.generate`,
      "a worker's generate subject is kv.<ns>.worker.<wid>.generate");
  }
  assert.deepEqual(wids.sort((a, b) => a - b), WORKERS, "worker ids are each --id");
});

test("ping/info/stats by instance id: $SRV.<verb>.kvrouter.<id> answers that instance alone", T, async () => {
  const routers = await svc(h.nc, "ping", "kvrouter");
  for (const r of routers) {
    for (const verb of ["ping", "info", "stats"]) {
      const got = await svc(h.nc, verb, "kvrouter", r.id);
      assert.equal(got.length, 1, `$SRV.${verb.toUpperCase()}.kvrouter.${r.id}: one answer, got ${show(got)}`);
      assert.equal(got[0].id, r.id);
    }
  }
});

function checkEndpointStats(e, who) {
  for (const k of ["num_requests", "num_errors", "processing_time", "average_processing_time"]) {
    assert.ok(Number.isSafeInteger(e[k]) && e[k] >= 0,
      `${who} endpoint ${e.name}: ${k} must be a non-negative integer, got ${show(e[k])}`);
  }
  assert.equal(typeof e.last_error, "string", `${who} ${e.name}: last_error is a string`);
  assert.ok(e.errors_by_code && typeof e.errors_by_code === "object" &&
    !Array.isArray(e.errors_by_code),
  `${who} endpoint ${e.name}: errors_by_code must be an object (code -> count), got ${show(e.errors_by_code)}`);
  for (const [code, n] of Object.entries(e.errors_by_code)) {
    assert.ok(DIGITS.test(code) || /^(KVR_)?ERR_[A-Z_]+$/.test(code),
      `${who} ${e.name}: errors_by_code keys are error codes (a number or an ERR_ name), got "${code}"`);
    assert.ok(Number.isSafeInteger(n) && n > 0, `${who} ${e.name}: errors_by_code["${code}"] ` +
      `is a count, got ${show(n)}`);
  }
  let sum = 0;
  for (const n of Object.values(e.errors_by_code)) sum += n;
  assert.ok(sum <= e.num_errors || e.num_errors === 0 && sum === 0,
    `${who} ${e.name}: errors_by_code adds up to at most num_errors (${sum} > ${e.num_errors})`);
}

test("stats: the endpoints' counts, errors_by_code and the router's data", T, async () => {
  // one request, so that the counts move
  const s = generate(h.nc, NS, { request_id: rid("stats"), token_ids: prompt(100, freshSeed()),
    max_tokens: 4 });
  await s.waitFinal(15000);
  s.close();
  const rs = await waitUntil(async () => {
    const r = await svc(h.nc, "stats", "kvrouter");
    const n = r.flatMap((x) => x.endpoints || []).filter((e) => e.name === "generate")
      .reduce((a, e) => a + (e.num_requests || 0), 0);
    return r.length === 2 && n >= 1 ? r : null;
  }, 10000, "both routers' STATS, generate's num_requests summing to >= 1 after one generate");
  for (const r of rs) {
    assert.equal(r.type, "io.nats.micro.v1.stats_response", `STATS type: ${show(r)}`);
    assert.equal(r.name, "kvrouter");
    assert.ok(typeof r.started === "string" && !Number.isNaN(Date.parse(r.started)),
      `STATS started is an RFC 3339 time: ${show(r.started)}`);
    const eps = Object.fromEntries((r.endpoints || []).map((e) => [e.name, e]));
    assert.deepEqual(Object.keys(eps).sort(), ["generate", "select"]);
    for (const e of Object.values(eps)) checkEndpointStats(e, `router ${r.metadata?.router_id}`);
    assert.ok(eps.generate.data && typeof eps.generate.data === "object",
      `STATS generate's data holds the router's figures: ${show(eps.generate.data)}`);
    assert.ok(JSON.stringify(r).includes('"bookings_expired"'),
      `STATS counts bookings_expired (docs/protocol.md, "Select, then forward"): ${show(r)}`);
  }
  const ws = await svc(h.nc, "stats", "kvworker");
  assert.equal(ws.length, 2, `both workers' STATS: ${show(ws)}`);
  for (const w of ws) {
    assert.equal(w.type, "io.nats.micro.v1.stats_response");
    assert.equal(w.name, "kvworker");
    const gen = (w.endpoints || []).find((e) => e.name === "generate");
    assert.ok(gen, `worker STATS has endpoint generate: ${show(w.endpoints)}`);
    checkEndpointStats(gen, `worker ${w.metadata?.worker_id}`);
  }
});

// Every number literal in a JSON text (outside strings) that is an integer must be a safe one.
function unsafeNumbers(text) {
  const bad = [];
  const re = /"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?/g;
  let m;
  while ((m = re.exec(text))) {
    const lit = m[0];
    if (lit.startsWith('"')) continue;
    const v = Number(lit);
    if (!Number.isFinite(v)) bad.push(lit);
    else if (Number.isInteger(v) && !Number.isSafeInteger(v)) bad.push(lit);
    else if (/^-?\d+$/.test(lit) && BigInt(lit) !== BigInt(v)) bad.push(lit);
  }
  return bad;
}

test("64-bit numbers: every JSON number is a safe integer (larger ones come as strings)", T, async () => {
  const checked = [];
  for (const verb of ["PING", "INFO", "STATS"]) {
    for (const name of ["kvrouter", "kvworker"]) {
      const it = await h.nc.requestMany(`$SRV.${verb}.${name}`, new Uint8Array(0),
        MANY);
      let n = 0;
      for await (const m of it) {
        n++;
        const text = new TextDecoder().decode(m.data);
        assert.doesNotThrow(() => JSON.parse(text), `$SRV.${verb}.${name} answers JSON`);
        const bad = unsafeNumbers(text);
        assert.deepEqual(bad, [], `$SRV.${verb}.${name}: JSON numbers past 2^53 - 1 must be ` +
          `strings of decimal digits (docs/protocol.md "Discovery"); found ${bad.join(", ")}`);
      }
      assert.equal(n, 2, `$SRV.${verb}.${name}: 2 answers`);
      checked.push(`${verb}.${name}`);
    }
  }
  assert.equal(checked.length, 6);
  assert.deepEqual(unsafeNumbers('{"a":9007199254740993,"b":"9007199254740993","c":1.5}'),
    ["9007199254740993"], "the checker itself");
});
