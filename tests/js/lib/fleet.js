// A real fleet for the conformance suite: one nats-server on 127.0.0.1 (a free port, max_payload
// 8MB, from a config file in a temp dir), routers and workers from the build directory
// (KVR_BUILD, default the repository's build/). Everything started here is
// killed by stop(), and at the latest when this process exits (also on failure or a signal).
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { setTimeout as sleep } from "node:timers/promises";
import { connect } from "@nats-io/transport-node";
import { Svcm } from "@nats-io/services";
import { pb, encode, decode } from "./proto.js";

// KVR_BUILD, else this repository's build/, wherever it is checked out
export const BUILD = process.env.KVR_BUILD ||
  path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../../build");

const live = new Set(); // every child process still running, for the exit hook
const dirs = new Set(); // fleets' temp dirs not removed yet

function killAllNow() {
  for (const p of live) {
    try {
      p.kill("SIGKILL");
    } catch {
      // gone already
    }
  }
  for (const d of dirs) {
    if (process.env.KVR_JS_KEEP) continue;
    try {
      fs.rmSync(d, { recursive: true, force: true });
    } catch {
      // a process may still write there for a moment
    }
  }
}
process.on("exit", killAllNow);
for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"]) {
  process.on(sig, () => {
    killAllNow();
    process.exit(128 + (os.constants.signals[sig] || 1));
  });
}

// The first executable file named `name` under BUILD (build/src/<name> in the meson layout).
export function findBinary(name) {
  const direct = [path.join(BUILD, "src", name), path.join(BUILD, name)];
  for (const p of direct) if (isExec(p)) return p;
  const queue = [BUILD];
  while (queue.length) {
    const dir = queue.shift();
    let ents;
    try {
      ents = fs.readdirSync(dir, { withFileTypes: true });
    } catch {
      continue;
    }
    for (const e of ents) {
      const p = path.join(dir, e.name);
      if (e.isDirectory() && !e.name.endsWith(".p") && e.name !== "meson-private") queue.push(p);
      else if (e.name === name && isExec(p)) return p;
    }
  }
  throw new Error(`no executable ${name} under KVR_BUILD=${BUILD} (build it: cd build && ninja)`);
}

function isExec(p) {
  try {
    const st = fs.statSync(p);
    if (!st.isFile()) return false;
    fs.accessSync(p, fs.constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

function natsServerBinary() {
  if (process.env.NATS_SERVER) return process.env.NATS_SERVER;
  for (const p of ["/usr/sbin/nats-server", "/usr/bin/nats-server", "/usr/local/bin/nats-server"])
    if (isExec(p)) return p;
  const r = spawnSync("sh", ["-c", "command -v nats-server"], { encoding: "utf8" });
  if (r.status === 0 && r.stdout.trim()) return r.stdout.trim();
  throw new Error("nats-server not found (apt-get install nats-server)");
}

// Poll fn() (may be async) until it returns a truthy value; throw `what` after timeoutMs.
export async function waitUntil(fn, timeoutMs, what, intervalMs = 25) {
  const end = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > end)
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}` +
        (last ? ` (last error: ${last.message})` : ""));
    await sleep(intervalMs);
  }
}

export class Fleet {
  constructor(label) {
    this.label = label;
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), `kvr-js-${label}-`));
    dirs.add(this.dir);
    this.procs = []; // {name, proc, log}
    this.url = null;
    this.nc = null;
  }

  // nats-server on 127.0.0.1, a free port chosen by the server (-p -1), found in its ports file.
  async startServer() {
    const conf = path.join(this.dir, "nats.conf");
    fs.writeFileSync(conf, "# kvrouter conformance suite\nmax_payload: 8MB\n");
    this.spawnProc("nats-server", natsServerBinary(),
      ["-c", conf, "-a", "127.0.0.1", "-p", "-1", "--ports_file_dir", this.dir]);
    const server = this.procs[this.procs.length - 1];
    this.url = await waitUntil(() => {
      for (const f of fs.readdirSync(this.dir)) {
        if (!f.endsWith(".ports") || !f.includes(String(server.proc.pid))) continue;
        const j = JSON.parse(fs.readFileSync(path.join(this.dir, f), "utf8"));
        const u = (j.nats || [])[0];
        if (u && /^nats:\/\/127\.0\.0\.1:\d+$/.test(u)) return u;
      }
      if (server.proc.exitCode !== null) throw new Error(`nats-server exited: ${this.tail(server)}`);
      return null;
    }, 10000, "nats-server's ports file");
    this.nc = await this.connect("fleet-control");
    return this.url;
  }

  async connect(name = "kvr-js") {
    // this server alone (127.0.0.1), never an address it might advertise
    return connect({ servers: this.url, name, maxReconnectAttempts: 0, ignoreClusterUpdates: true });
  }

  spawnProc(name, bin, args, env = {}) {
    const log = path.join(this.dir, `${name}.log`);
    const fd = fs.openSync(log, "a");
    const proc = spawn(bin, args, {
      stdio: ["ignore", fd, fd],
      env: { ...process.env, ...env },
    });
    fs.closeSync(fd);
    const entry = { name, proc, log, bin, args };
    live.add(proc);
    proc.on("exit", () => live.delete(proc));
    this.procs.push(entry);
    return entry;
  }

  tail(entry, n = 15) {
    try {
      return fs.readFileSync(entry.log, "utf8").trim().split("\n").slice(-n).join("\n");
    } catch {
      return "(no log)";
    }
  }

  // A router in namespace ns with router id `id`.
  router(ns, id, extra = []) {
    return this.spawnProc(`kvrouter-${ns}-${id}`, findBinary("kvrouter"), [
      "--nats", this.url, "--namespace", ns, "--id", id, "--log-level", "info",
      "--warmup-ms", "300", "--seed", "1", ...extra,
    ]);
  }

  // A simulated worker in namespace ns with worker id `id` (a number).
  worker(ns, id, extra = []) {
    return this.spawnProc(`kvworker-${ns}-${id}`, findBinary("kvworker"), [
      "--nats", this.url, "--namespace", ns, "--id", String(id), "--log-level", "info",
      "--heartbeat-ms", "500", "--drain-timeout-ms", "1000", ...extra,
    ]);
  }

  // Wait until selects (book = false) in ns are answered by each of routerIds, each seeing
  // nWorkers candidates: the fleet routes. For nWorkers = 0, until each router answers at all.
  async waitRouting(ns, routerIds, nWorkers, timeoutMs = 20000) {
    const seen = new Set();
    let anon = 0;
    const req = { request_id: "fleet-ready", token_ids: [1, 2, 3, 4], max_tokens: 1 };
    await waitUntil(async () => {
      for (const p of this.procs) {
        if (p.proc.exitCode !== null || p.proc.signalCode !== null)
          throw new Error(`${p.name} exited early: ${this.tail(p)}`);
      }
      let m;
      try {
        m = await this.nc.request(`kv.${ns}.select`, encode("SelectRequest", { request: req }),
          { timeout: 1000 });
      } catch {
        return false;
      }
      const r = decode("SelectResponse", m.data);
      const n = (r.candidates || []).length;
      if (nWorkers === 0 || (r.error_code === 0 && n === nWorkers)) {
        // router_id names who answered; without it (a router before the contract's router_id),
        // 10 good answers in a row stand for "every router" (queue groups spread them).
        seen.add(r.router_id || `anonymous-${++anon}`);
      } else {
        anon = 0;
        for (const k of [...seen]) if (k.startsWith("anonymous-")) seen.delete(k);
      }
      return routerIds.every((id) => seen.has(id)) || anon >= 10;
    }, timeoutMs, `namespace ${ns}: routers ${routerIds.join(",")} answering selects` +
      ` with ${nWorkers} candidates (seen ${[...seen].join(",") || "none"})`, 20);
  }

  // Kill one process with a signal, wait for it to exit.
  async kill(entry, signal = "SIGKILL", timeoutMs = 5000) {
    if (entry.proc.exitCode !== null || entry.proc.signalCode !== null) return;
    const gone = new Promise((r) => entry.proc.once("exit", r));
    entry.proc.kill(signal);
    await Promise.race([gone, sleep(timeoutMs)]);
  }

  // Stop everything: routers and workers with SIGTERM (SIGKILL after 3 s), then the server.
  async stop() {
    try {
      if (this.nc) await this.nc.close();
    } catch {
      // closed already
    }
    const daemons = this.procs.filter((p) => p.name !== "nats-server");
    const server = this.procs.filter((p) => p.name === "nats-server");
    await Promise.all(daemons.map(async (p) => {
      await this.kill(p, "SIGTERM", 3000);
      await this.kill(p, "SIGKILL", 2000);
    }));
    await Promise.all(server.map((p) => this.kill(p, "SIGKILL", 2000)));
    dirs.delete(this.dir);
    if (!process.env.KVR_JS_KEEP) fs.rmSync(this.dir, { recursive: true, force: true });
    else console.error(`# fleet ${this.label}: logs kept in ${this.dir}`);
  }
}

// Service API options for requestMany: all answers, the collection ending 300 ms after the last
// one (or at 5 s); every instance here answers within milliseconds.
export const MANY = { strategy: "stall", stall: 300, maxWait: 5000 };

// $SRV.<verb>[.name[.id]] through the services client (Svcm): every answer.
export async function svc(nc, verb, name = "", id = "") {
  const client = new Svcm(nc).client(MANY);
  const it = await client[verb](name, id);
  const out = [];
  for await (const r of it) out.push(r);
  return out;
}

export { pb };
