// A namespace whose workers can be made busy, so that requests wait in a router's queue: small
// KV pools (64 blocks of 16 tokens), routers that call a worker busy above half of its pool and
// let requests wait 30 s (so that a waiting request is never answered "overloaded" here).
import { generate, cancel, select, prompt, freshSeed, rid, sleep } from "./client.js";

export const BUSY_WORKER_ARGS = ["--block-size", "16", "--num-blocks", "64"];
export const BUSY_ROUTER_ARGS = ["--block-size", "16", "--busy-threshold", "0.5",
  "--queue-timeout-ms", "30000"];

// Occupy every worker of ns with a long request of 640 prompt tokens (40 of 64 blocks: over the
// busy threshold), one after the other, and wait until selects see every candidate busy.
// Returns the filler streams and whether busy-ness was confirmed by selects.
export async function fillWorkers(nc, ns, nWorkers, maxTokens = 150) {
  const fillers = [];
  for (let i = 0; i < nWorkers; i++) {
    const req = { request_id: rid(`filler${i}`), token_ids: prompt(640, freshSeed()), max_tokens: maxTokens };
    const s = generate(nc, ns, req);
    fillers.push(s);
    await s.waitFor((x) => x.chunks.length > 0, 15000, `filler ${i} streaming`);
  }
  let confirmed = false;
  const probe = { request_id: rid("probe"), token_ids: prompt(32, freshSeed()), max_tokens: 1 };
  let allBusy = 0;
  for (let i = 0; i < 100 && !confirmed; i++) {
    try {
      const { resp } = await select(nc, ns, probe, false, 2000);
      const c = resp.candidates || [];
      // every candidate busy, or the select itself answered ERR_OVERLOADED (7)
      const busy = resp.error_code === 7 || (c.length === nWorkers && c.every((x) => x.busy));
      allBusy = busy ? allBusy + 1 : 0;
      confirmed = allBusy >= 4; // four answers in a row (both routers, most likely)
    } catch {
      allBusy = 0;
    }
    if (!confirmed) await sleep(20);
  }
  return { fillers, confirmed };
}

// Cancel the fillers and wait (a while) for their final chunks.
export async function releaseFillers(nc, ns, fillers) {
  for (const s of fillers) cancel(nc, ns, s.request.request_id, s.inbox);
  await Promise.allSettled(fillers.map((s) => s.waitFinal(15000)));
  for (const s of fillers) s.close();
}
