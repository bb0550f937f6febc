// A kvrouter client as docs/protocol.md describes it: a stream on an inbox, its chunks decoded,
// and checks of the stream's invariants with messages that say what the contract demands.
import { createInbox } from "@nats-io/transport-node";
import { setTimeout as sleep } from "node:timers/promises";
import { encode, decode, codeName } from "./proto.js";

export const ERR_HEADER = "Nats-Service-Error-Code";
export const ERR_TEXT_HEADER = "Nats-Service-Error";

let seq = 0;
// A request id unique in this run.
export function rid(tag = "r") {
  seq += 1;
  return `js-${tag}-${process.pid}-${Date.now().toString(36)}-${seq}`;
}

// A deterministic pseudo-random prompt of n tokens (ids 1..50000) from a seed.
export function prompt(n, seed) {
  let x = (seed * 2654435761) >>> 0 || 1;
  const out = new Array(n);
  for (let i = 0; i < n; i++) {
    x ^= x << 13; x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5; x >>>= 0;
    out[i] = 1 + (x % 50000);
  }
  return out;
}
let seedSeq = Math.floor(Math.random() * 1e6);
export const freshSeed = () => ++seedSeq;

// Everything that arrives on one inbox.
export class Stream {
  constructor(nc, inbox = createInbox()) {
    this.nc = nc;
    this.inbox = inbox;
    this.msgs = []; // {t, size, status, headers, chunk | null, decodeError}
    this.waiters = [];
    this.t0 = Date.now();
    this.sub = nc.subscribe(inbox, {
      callback: (err, m) => {
        if (err) return;
        this.onMsg(m);
      },
    });
  }

  onMsg(m) {
    const h = m.headers;
    const rec = {
      t: Date.now(),
      size: m.data.length,
      status: h ? h.code : 0,
      errCode: h ? h.get(ERR_HEADER) : "",
      errText: h ? h.get(ERR_TEXT_HEADER) : "",
      headers: h,
      data: m.data,
      chunk: null,
      decodeError: null,
    };
    if (!(h && h.code >= 300) && m.data.length > 0) {
      try {
        rec.chunk = decode("GenerateResponse", m.data);
      } catch (e) {
        rec.decodeError = e.message;
      }
    } else if (m.data.length === 0 && !(h && h.code)) {
      // an empty payload is a valid, empty, non-final chunk
      rec.chunk = decode("GenerateResponse", m.data);
    }
    this.msgs.push(rec);
    for (const w of [...this.waiters]) w.check();
  }

  get chunks() {
    return this.msgs.filter((m) => m.chunk).map((m) => m.chunk);
  }

  get finals() {
    return this.chunks.filter((c) => c.final);
  }

  get final() {
    return this.finals[0] || null;
  }

  // Resolve once pred(this) holds; reject after timeoutMs with `what` and the stream so far.
  waitFor(pred, timeoutMs, what) {
    return new Promise((resolve, reject) => {
      const w = {
        check: () => {
          if (pred(this)) {
            clearTimeout(w.timer);
            this.waiters = this.waiters.filter((x) => x !== w);
            resolve(this);
          }
        },
      };
      w.timer = setTimeout(() => {
        this.waiters = this.waiters.filter((x) => x !== w);
        reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}; ` +
          `the stream so far: ${this.summary()}`));
      }, timeoutMs);
      this.waiters.push(w);
      w.check();
    });
  }

  waitFinal(timeoutMs = 15000, what = "the final chunk (final = true)") {
    return this.waitFor((s) => s.finals.length > 0, timeoutMs, what);
  }

  waitChunks(n, timeoutMs = 15000) {
    return this.waitFor((s) => s.chunks.filter((c) => !c.final).length >= n, timeoutMs,
      `${n} token chunks`);
  }

  // Wait for the final chunk, then `quietMs` more, so anything sent after it is seen too.
  async complete(timeoutMs = 15000, quietMs = 300) {
    await this.waitFinal(timeoutMs);
    await sleep(quietMs);
    return this;
  }

  close() {
    try {
      this.sub.unsubscribe();
    } catch {
      // closed
    }
  }

  summary(max = 12) {
    if (this.msgs.length === 0) return "(nothing received)";
    const parts = this.msgs.map((m) => {
      if (!m.chunk) {
        return `[non-chunk: status ${m.status}, ${m.size} bytes${m.decodeError ?
          `, undecodable: ${m.decodeError}` : ""}]`;
      }
      const c = m.chunk;
      let s = `pos=${c.position} +${c.token_ids.length} w=${c.worker_id}`;
      if (c.cached_tokens) s += ` cached=${c.cached_tokens}`;
      if (c.final) {
        s = `FINAL ${s} code=${c.error_code}(${codeName(c.error_code)}) reason="${c.finish_reason}"` +
          (c.error ? ` error="${c.error}"` : "") + (m.errCode ? ` hdr=${m.errCode}` : "");
      }
      return s;
    });
    const shown = parts.length > max ?
      [...parts.slice(0, max / 2), `... ${parts.length - max} more ...`, ...parts.slice(-max / 2)] :
      parts;
    return `${this.msgs.length} messages: ${shown.join(" | ")}`;
  }
}

// Publish a GenerateRequest to kv.<ns>.generate with a fresh inbox (or opts.inbox) as reply.
export function generate(nc, ns, req, opts = {}) {
  const s = opts.stream || new Stream(nc, opts.inbox);
  s.request = req;
  s.bytes = opts.bytes || encode("GenerateRequest", req);
  publishGenerate(nc, ns, s);
  return s;
}

// (Re)publish a stream's request bytes, the same inbox as reply: a resend.
export function publishGenerate(nc, ns, s) {
  nc.publish(`kv.${ns}.generate`, s.bytes, { reply: s.inbox });
}

export function cancel(nc, ns, requestId, reply) {
  nc.publish(`kv.${ns}.cancel`, encode("CancelRequest", { request_id: requestId, reply }));
}

export async function select(nc, ns, request, book, timeout = 5000) {
  const m = await nc.request(`kv.${ns}.select`, encode("SelectRequest", { request, book }),
    { timeout });
  return { resp: decode("SelectResponse", m.data), msg: m };
}

// The problems of a stream that should have completed as one good stream, as contract
// sentences. opts: requestId, workerId (expected), maxTokens (tokens expected, if it ran to
// "length"), strictPositions (no repeats either: true unless a connection was cut),
// finalMayRepeat (the final chunk's position may be below the tokens received).
export function streamProblems(s, opts = {}) {
  const p = [];
  const strict = opts.strictPositions !== false;
  const bad = s.msgs.filter((m) => !m.chunk);
  for (const m of bad) {
    p.push(`a message that is no GenerateResponse arrived (status ${m.status}, ${m.size} bytes` +
      `${m.decodeError ? `, ${m.decodeError}` : ""})`);
  }
  const chunks = s.chunks;
  if (chunks.length === 0) {
    p.push("no chunk arrived");
    return p;
  }
  const finals = chunks.filter((c) => c.final);
  if (finals.length !== 1) {
    p.push(`exactly one chunk must have final = true (contract: "exactly one chunk has final = ` +
      `true, the last"), got ${finals.length}`);
  }
  const fi = chunks.findIndex((c) => c.final);
  if (fi >= 0 && fi !== chunks.length - 1) {
    p.push(`nothing may follow the final chunk, but ${chunks.length - 1 - fi} chunk(s) came ` +
      `after it`);
  }
  const wids = [...new Set(chunks.map((c) => c.worker_id))];
  if (wids.length !== 1) {
    p.push(`every chunk must carry the same worker_id (one stream, one worker), saw ${wids.join(", ")}`);
  }
  if (opts.workerId !== undefined && wids[0] !== String(opts.workerId)) {
    p.push(`worker_id must be ${opts.workerId}, got ${wids.join(", ")}`);
  }
  if (wids.includes("0") && finals.length && finals[0].error_code === 0) {
    p.push("a stream that generated tokens must name its worker (worker_id 0 is a router's)");
  }
  const ids = [...new Set(chunks.map((c) => c.request_id))];
  if (opts.requestId !== undefined && (ids.length !== 1 || ids[0] !== opts.requestId)) {
    p.push(`every chunk must carry request_id "${opts.requestId}", saw ${ids.map((x) => `"${x}"`).join(", ")}`);
  }
  let n = 0;
  const posProblems = [];
  chunks.forEach((c, i) => {
    if (c.position === n) {
      n += c.token_ids.length;
    } else if (c.position > n) {
      posProblems.push(`chunk #${i} has position ${c.position} but ${n} tokens came before it: a gap ` +
        `(contract: positions follow without gaps)`);
      n = c.position + c.token_ids.length;
    } else if (c.final && opts.finalMayRepeat) {
      // allowed: a final chunk whose sender could not count the tokens (see the caller)
    } else {
      if (strict) {
        posProblems.push(`chunk #${i} has position ${c.position} but ${n} tokens came before it: a ` +
          `repeat, with no connection cut (contract: positions follow without gaps)`);
      }
      n = Math.max(n, c.position + c.token_ids.length);
    }
  });
  if (opts.maxTokens !== undefined) {
    // kept by position, as the contract has a client keep them: complete = a final chunk and
    // every position below its end (its position + its tokens: the stream's total)
    const byPos = [];
    for (const c of chunks) c.token_ids.forEach((t, i) => { byPos[c.position + i] = t; });
    let held = 0;
    while (held < byPos.length && byPos[held] !== undefined) held++;
    const f = finals[finals.length - 1];
    const end = f ? f.position + f.token_ids.length : null;
    const raw = chunks.reduce((a, c) => a + c.token_ids.length, 0);
    if (held !== opts.maxTokens || (end !== null && end !== opts.maxTokens)) {
      p.push(`the stream must carry max_tokens = ${opts.maxTokens} tokens in all: by the positions ` +
        `it holds ${held} from position 0${end !== null ? `, its final chunk ends at ${end}` : ""} ` +
        `(${raw} token_ids in all its chunks)`);
    }
  }
  // positions last: when they are wrong on every chunk, the other problems stay readable
  p.push(...posProblems.slice(0, 3));
  if (posProblems.length > 3) p.push(`... and ${posProblems.length - 3} more chunks out of position`);
  return p;
}

// Assert helper: fail with the problems and the stream.
export function problemsMessage(what, problems, s) {
  return `${what}:\n  - ${problems.join("\n  - ")}\n  stream: ${s.summary()}`;
}

export { sleep };
