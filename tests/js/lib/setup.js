// Each test's own limit: generous (nothing here waits for long when the fleet keeps the contract),
// so that a hang fails the test instead of the run.
export const T = { timeout: 90000 };

// One fleet per test file: a nats-server and, per namespace, routers and workers.
import { after, before } from "node:test";
import { Fleet, svc, waitUntil } from "./fleet.js";

// spec: [{ ns, routers: [ids], workers: [ids], routerArgs, workerArgs }]. Returns a holder whose
// .fleet, .nc and .info[ns] (the routers' $SRV.INFO answers) are set once before() ran.
export function useFleet(label, spec) {
  const h = { fleet: null, nc: null, info: {}, spec };
  before(async () => {
    const f = new Fleet(label);
    h.fleet = f;
    await f.startServer();
    h.nc = f.nc;
    for (const n of spec) {
      for (const id of n.workers || []) f.worker(n.ns, id, n.workerArgs || []);
      for (const id of n.routers || []) f.router(n.ns, id, n.routerArgs || []);
    }
    for (const n of spec) {
      if (!(n.routers || []).length) continue;
      await f.waitRouting(n.ns, n.routers, (n.workers || []).length);
    }
    // Every router answers $SRV.INFO (for the limits it announces).
    const all = spec.flatMap((n) => n.routers || []);
    const infos = await waitUntil(async () => {
      const r = await svc(f.nc, "info", "kvrouter");
      return r.length >= all.length ? r : null;
    }, 10000, `$SRV.INFO.kvrouter answered by all ${all.length} routers`);
    for (const n of spec) {
      h.info[n.ns] = infos.filter((i) =>
        (i.endpoints || []).some((e) => e.subject === `kv.${n.ns}.generate`));
    }
  }, { timeout: 60000 });
  after(async () => {
    if (h.fleet) await h.fleet.stop();
  }, { timeout: 30000 });
  return h;
}

// A router limit announced in $SRV.INFO metadata of namespace ns, as a number (or null).
export function limit(h, ns, key) {
  for (const i of h.info[ns] || []) {
    const v = i.metadata && i.metadata[key];
    if (v !== undefined && /^\d+$/.test(String(v))) return Number(v);
  }
  return null;
}
