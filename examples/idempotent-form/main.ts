/**
 * An order form whose submission runs once, however often it is clicked or retried: the page gives
 * each form a fresh Idempotency-Key, and `idempotency()` runs the handler once per user and key,
 * replaying its reply to every other submission of it. Run it against the local Redis that
 * `deno task dev` starts (it prints the URL and token):
 *
 *   UPSTASH_REDIS_REST_URL=… UPSTASH_REDIS_REST_TOKEN=… deno run -A examples/idempotent-form/main.ts
 *
 * @module
 */
import { Hono } from "hono";
import { Redis } from "@upstash/redis";
import { Records } from "@edgelock/edgelock/uses";
import { idempotency } from "@edgelock/edgelock/hono";

const records = new Records(Redis.fromEnv());
let created = 0; // your database: how many orders were really made

const PAGE = `<!doctype html>
<html lang="en"><meta charset="utf-8"><title>Order</title>
<form id="order"><label>Item <input name="item" value="book"></label>
<button>Place order</button></form><p id="result" role="status"></p>
<script type="module">
const form = document.getElementById("order");
let key = crypto.randomUUID(); // one per form: every submission of it is the same order
form.onsubmit = async (event) => {
  event.preventDefault();
  const res = await fetch("/orders", {
    method: "POST",
    headers: { "content-type": "application/json", "idempotency-key": key },
    body: JSON.stringify({ item: form.item.value }),
  });
  const body = await res.json();
  document.getElementById("result").textContent = res.ok
    ? "Order " + body.orderId + (res.headers.get("idempotent-replayed") ? " (already placed)" : "")
    : body.detail;
};
</script></html>`;

const app = new Hono();
app.get("/", (c) => c.html(PAGE));
app.get("/orders/count", (c) => c.json({ created }));
app.post(
  "/orders",
  idempotency({
    records,
    scope: (c) => c.req.header("x-user-id") ?? "anonymous", // your auth: whose keys these are
    waitMs: 2_000, // a second click waits for the first and gets its reply
  }),
  async (c) => {
    const { item } = await c.req.json<{ item: string }>();
    await new Promise((resolve) => setTimeout(resolve, 200)); // the work the order takes
    created++;
    return c.json({ orderId: crypto.randomUUID(), item }, 201);
  },
);

Deno.serve({ hostname: "127.0.0.1", port: Number(Deno.env.get("PORT") ?? 8789) }, app.fetch);
