/**
 * Sends signed test deliveries to a webhook endpoint, as a provider does: `--ids` events, each
 * delivered `--copies` times, concurrently and shuffled (a provider's retries and duplicates),
 * signed with `WEBHOOK_SECRET` by the Standard Webhooks scheme. A 409 (the same id in flight) is
 * retried after its Retry-After, as providers do. Prints what the endpoint answered:
 *
 *   deno run -A examples/webhook-worker/send.ts --url http://127.0.0.1:8788/webhooks
 *
 * @module
 */
import { cli } from "../../bridge/_cli.ts";

const flags = cli("send", "deno run -A examples/webhook-worker/send.ts --url <endpoint>", {
  url: { type: "string", help: "the webhook endpoint" },
  ids: { type: "number", default: 10, min: 1, max: 1000, help: "distinct events" },
  copies: { type: "number", default: 3, min: 1, max: 20, help: "deliveries of each event" },
});
const secret = Deno.env.get("WEBHOOK_SECRET");
if (!flags.url || !secret) {
  console.error("send: give --url, and the endpoint's secret in WEBHOOK_SECRET (whsec_…)");
  Deno.exit(2);
}
const key = await crypto.subtle.importKey(
  "raw",
  Uint8Array.from(atob(secret.replace(/^whsec_/, "")), (ch) => ch.charCodeAt(0)),
  { name: "HMAC", hash: "SHA-256" },
  false,
  ["sign"],
);

async function deliver(id: string, body: string): Promise<"processed" | "duplicate" | number> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const timestamp = String(Math.floor(Date.now() / 1000));
    const mac = await crypto.subtle.sign(
      "HMAC",
      key,
      new TextEncoder().encode(`${id}.${timestamp}.${body}`),
    );
    const signature = `v1,${btoa(String.fromCharCode(...new Uint8Array(mac)))}`;
    const res = await fetch(flags.url!, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "webhook-id": id,
        "webhook-timestamp": timestamp,
        "webhook-signature": signature,
      },
      body,
    });
    const text = await res.text();
    if (res.status === 409) { // the same id is being processed: retry as the provider would
      await new Promise((r) => setTimeout(r, 100 * Number(res.headers.get("retry-after") ?? 1)));
      continue;
    }
    if (res.status !== 200) return res.status;
    return text.startsWith("processed") ? "processed" : "duplicate";
  }
  return 409;
}

// Ids of this run's own, so a second run is processed anew.
const run = crypto.randomUUID().slice(0, 8);
const deliveries = Array.from({ length: flags.ids * flags.copies }, (_, i) => {
  const n = i % flags.ids;
  return { id: `msg_${run}_${n}`, body: JSON.stringify({ type: `event.${n}` }) };
});
const counts = { processed: 0, duplicate: 0, failed: 0 };
deliveries.sort(() => Math.random() - 0.5);
await Promise.all(deliveries.map(async ({ id, body }) => {
  const outcome = await deliver(id, body);
  if (typeof outcome === "number") counts.failed++;
  else counts[outcome]++;
}));
console.log(
  `sent ${deliveries.length} deliveries of ${flags.ids} events: ${counts.processed} processed, ` +
    `${counts.duplicate} duplicates, ${counts.failed} failed`,
);
if (counts.failed > 0) Deno.exit(1);
