// A Worker with idempotency() whose replies stream their bytes as workerd lets a stream send them:
// an ArrayBuffer, a Uint16Array. Bundled by test/worker_test.ts.
import { Hono } from "hono";
import { Redis } from "@upstash/redis/cloudflare";
import { idempotency } from "../src/hono/idempotency.ts";
import { Records } from "../src/uses/records.ts";

type Env = { UPSTASH_REDIS_REST_URL: string; UPSTASH_REDIS_REST_TOKEN: string };
const app = new Hono<{ Bindings: Env }>();
let runs = 0;
app.post(
  "/:view",
  idempotency({ records: (c) => new Records(Redis.fromEnv(c.env)), scope: () => "workerd" }),
  (c) => {
    runs++;
    const view = c.req.param("view");
    const body = new ReadableStream({
      start(controller) {
        if (view === "buffer") controller.enqueue(new TextEncoder().encode('{"order":1}').buffer);
        else controller.enqueue(new Uint16Array([0x4142, 0x4344]));
        controller.close();
      },
    });
    return new Response(body as ReadableStream<Uint8Array>, { status: 201 });
  },
);
app.get("/runs", (c) => c.text(String(runs)));
export default app;
