// Request ids and retries (docs/buyer-api.md) end to end. The official openai SDK with its default automatic
// retries, behind a TCP proxy that lets the gateway answer in full and then resets the buyer's
// connection: the SDK's retry (x-stainless-retry-count: 1, same body) gets the stored result replayed
// and the request is charged once. Identical bodies without a retry mark are separate requests; a
// retry of a request in flight waits for it; failed results are never replayed; Idempotency-Key
// replays, 409s while in flight and 422s for another body.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import net from "node:net";
import OpenAI from "openai";
import { startTestGateway, waitFor, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { ScriptedProvider } from "../support/scriptedProvider.ts";
import { settledRow } from "../settlement/support.ts";
import { ANSWER, Gate, chat, honestAnswer, newAccount, type Account } from "../quotas/support.ts";

const MODEL = "retry-model";
const GRANT = 1_000_000;
let gw: TestGateway;
let provider: ScriptedProvider;
const gate = new Gate();

/**
 * A loopback TCP proxy in front of the gateway. For the next `drop` requests it forwards the
 * request, reads the gateway's whole response (a JSON body of its content-length, or an SSE stream up
 * to [DONE]) and then resets the buyer's connection without passing on a byte: the gateway answered,
 * the buyer never heard it.
 */
function droppingProxy(targetPort: number) {
  let drop = 0;
  const sockets = new Set<net.Socket>();
  let dropped = 0;
  const server = net.createServer((client) => {
    sockets.add(client);
    // Decided per request, not per connection: the SDK reuses keep-alive connections.
    let dropping = false;
    const upstream = net.connect(targetPort, "127.0.0.1");
    sockets.add(upstream);
    client.on("data", (d) => {
      if (!dropping && drop > 0 && d.toString("latin1").startsWith("POST ")) {
        drop--;
        dropping = true;
      }
      upstream.write(d);
    });
    client.on("close", () => upstream.destroy());
    client.on("error", () => upstream.destroy());
    upstream.on("error", () => client.destroy());
    let seen = Buffer.alloc(0);
    upstream.on("data", (d: Buffer) => {
      if (!dropping) {
        client.write(d);
        return;
      }
      seen = Buffer.concat([seen, d]);
      if (responseComplete(seen)) {
        dropped++;
        client.resetAndDestroy();
        upstream.destroy();
      }
    });
    upstream.on("end", () => client.end());
  });
  return {
    listen: () => new Promise<number>((resolve) => server.listen(0, "127.0.0.1", () => resolve((server.address() as net.AddressInfo).port))),
    dropNext(n: number) {
      drop = n;
    },
    get dropped() {
      return dropped;
    },
    close() {
      for (const s of sockets) s.destroy();
      server.close();
    },
  };
}

function responseComplete(bytes: Buffer): boolean {
  const text = bytes.toString("latin1");
  const headEnd = text.indexOf("\r\n\r\n");
  if (headEnd < 0) return false;
  if (text.includes("data: [DONE]")) return true;
  const length = /\r\ncontent-length:\s*(\d+)/i.exec(text.slice(0, headEnd));
  return length !== null && bytes.length - (headEnd + 4) >= Number(length[1]);
}

let proxy: ReturnType<typeof droppingProxy>;
let proxyUrl = "";

beforeAll(async () => {
  gw = await startTestGateway({ settlementMode: "enforce" }, { catalog: [MODEL] });
  provider = await ScriptedProvider.connect({ url: gw.wsUrl, id: "retry-prov", models: [MODEL], maxConcurrency: 16, script: gate.script });
  await waitForReadyProviders(gw, 1);
  proxy = droppingProxy(gw.gateway.port);
  proxyUrl = `http://127.0.0.1:${await proxy.listen()}/v1`;
  gate.open();
});

afterAll(async () => {
  gate.open();
  proxy.close();
  await provider.close();
  await gw.close();
});

const messages = [{ role: "user" as const, content: "Say hello." }];

/** Charges of one account, from the ledger: settled attempts and its balance. */
async function charges(account: Account) {
  const store = gw.gateway.store;
  const rows = (await store.listSettlements()).filter((s) => s.account_id === account.accountId);
  for (const r of rows) await settledRow(gw, r.request_id, r.attempt_n);
  const settled = (await store.listSettlements()).filter((s) => s.account_id === account.accountId);
  const postings = (await store.ledgerAuditData()).postings.filter((p) => p.kind === "settlement" && settled.some((s) => s.request_id === p.request_id));
  return {
    requests: new Set(settled.map((s) => s.request_id)).size,
    postings: postings.length,
    debited: GRANT - await store.ledgerBalance(`buyer:${account.accountId}`),
  };
}

describe("the openai SDK's automatic retries after a dropped response are never billed twice", () => {
  test.each([false, true])("stream: %p — the retry replays the stored result; one job, one charge", async (stream) => {
    const account = await newAccount(gw, "paid", GRANT);
    // Default maxRetries (2): the SDK retries the connection error on its own.
    const client = new OpenAI({ apiKey: account.apiKey, baseURL: proxyUrl });
    const jobsBefore = provider.jobs.length;
    proxy.dropNext(1);
    const droppedBefore = proxy.dropped;
    let text = "";
    let id = "";
    let replayed: string | null = null;
    if (stream) {
      const { data, response } = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 16, stream: true }).withResponse();
      replayed = response.headers.get("idempotent-replayed");
      for await (const chunk of data) {
        text += chunk.choices[0]?.delta.content ?? "";
        id = chunk.id;
      }
    } else {
      const { data, response } = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 16 }).withResponse();
      replayed = response.headers.get("idempotent-replayed");
      text = data.choices[0]?.message.content ?? "";
      id = data.id;
    }
    expect(proxy.dropped).toBe(droppedBefore + 1);
    expect(text).toBe(ANSWER.join(""));
    expect(replayed).toBe("true");
    expect(provider.jobs.length - jobsBefore).toBe(1);
    expect(id).toBe(`chatcmpl-${provider.lastJob().request_id}`);
    const c = await charges(account);
    expect(c).toMatchObject({ requests: 1, postings: 1 });
    expect(c.debited).toBeGreaterThan(0);
    expect(c.debited).toBe((await gw.gateway.store.getSettlement(provider.lastJob().request_id, 0))!.debit_credits);
  });

  test("identical bodies without a retry mark stay separate requests, each billed", async () => {
    const account = await newAccount(gw, "paid", GRANT);
    const client = new OpenAI({ apiKey: account.apiKey, baseURL: gw.baseURL, maxRetries: 0 });
    const jobsBefore = provider.jobs.length;
    const a = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 16 });
    const b = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 16 });
    expect(a.id).not.toBe(b.id);
    expect(provider.jobs.length - jobsBefore).toBe(2);
    expect(await charges(account)).toMatchObject({ requests: 2, postings: 2 });
  });
});

describe("retry marks without a key (x-stainless-retry-count ≥ 1)", () => {
  const body = { model: MODEL, messages, max_tokens: 16 };

  test("a retry of a request still in flight waits for it and gets its result, not a second run", async () => {
    const account = await newAccount(gw, "paid", GRANT);
    gate.close();
    const jobsBefore = provider.jobs.length;
    const first = chat(gw, account.apiKey, body, { "x-stainless-retry-count": "0" });
    await waitFor(() => gate.held === 1, 5000, "the first request held");
    const retry = chat(gw, account.apiKey, body, { "x-stainless-retry-count": "1" });
    await Bun.sleep(50);
    expect(provider.jobs.length - jobsBefore).toBe(1);
    gate.open();
    const [a, b] = await Promise.all([first, retry]);
    expect(a.status).toBe(200);
    expect(b.status).toBe(200);
    expect(b.json).toEqual(a.json);
    expect(b.headers.get("idempotent-replayed")).toBe("true");
    expect(b.headers.get("x-request-id")).toBe(a.headers.get("x-request-id"));
    expect(provider.jobs.length - jobsBefore).toBe(1);
    expect(await charges(account)).toMatchObject({ requests: 1, postings: 1 });
  });

  test("a failed result is never replayed: the retry runs as a new request", async () => {
    const account = await newAccount(gw, "paid", GRANT);
    gate.answer = (a) => a.end({ terminal_state: "provider_error" });
    const failed = await chat(gw, account.apiKey, body);
    expect(failed.status).toBe(503);
    gate.answer = honestAnswer;
    const jobsBefore = provider.jobs.length;
    const retry = await chat(gw, account.apiKey, body, { "x-stainless-retry-count": "1" });
    expect(retry.status).toBe(200);
    expect(retry.headers.get("idempotent-replayed")).toBeNull();
    expect(provider.jobs.length - jobsBefore).toBe(1);
  });

  test("the match is per account and per body: another account's identical retry, or another body, runs", async () => {
    const a = await newAccount(gw, "paid", GRANT);
    const b = await newAccount(gw, "paid", GRANT);
    expect((await chat(gw, a.apiKey, body)).status).toBe(200);
    const jobsBefore = provider.jobs.length;
    const other = await chat(gw, b.apiKey, body, { "x-stainless-retry-count": "1" });
    expect(other.headers.get("idempotent-replayed")).toBeNull();
    const changed = await chat(gw, a.apiKey, { ...body, max_tokens: 15 }, { "x-stainless-retry-count": "1" });
    expect(changed.headers.get("idempotent-replayed")).toBeNull();
    expect(provider.jobs.length - jobsBefore).toBe(2);
    // The same body with a retry mark is replayed.
    const same = await chat(gw, a.apiKey, body, { "x-stainless-retry-count": "2" });
    expect(same.headers.get("idempotent-replayed")).toBe("true");
    expect(provider.jobs.length - jobsBefore).toBe(2);
  });
});

describe("Idempotency-Key", () => {
  const body = { model: MODEL, messages, max_tokens: 16 };

  test("the same key and body replays the first result; 409 while it is in flight; 422 for another body", async () => {
    const account = await newAccount(gw, "paid", GRANT);
    const key = { "idempotency-key": "order-42" };
    gate.close();
    const jobsBefore = provider.jobs.length;
    const first = chat(gw, account.apiKey, body, key);
    await waitFor(() => gate.held === 1, 5000, "the first request held");
    const duplicate = await chat(gw, account.apiKey, body, key);
    expect(duplicate.status).toBe(409);
    expect(duplicate.json.error).toMatchObject({ code: "duplicate_request_id", type: "invalid_request_error", retryable: false });
    gate.open();
    const a = await first;
    expect(a.status).toBe(200);

    const again = await chat(gw, account.apiKey, body, key);
    expect(again.status).toBe(200);
    expect(again.json).toEqual(a.json);
    expect(again.headers.get("idempotent-replayed")).toBe("true");

    const reused = await chat(gw, account.apiKey, { ...body, max_tokens: 17 }, key);
    expect(reused.status).toBe(422);
    expect(reused.json.error).toMatchObject({ code: "idempotency_key_reused", type: "invalid_request_error", retryable: false });
    expect(reused.headers.get("x-should-retry")).toBe("false");

    // Keys are per account: another account's request with the same key is its own.
    const other = await newAccount(gw, "paid", GRANT);
    const theirs = await chat(gw, other.apiKey, body, key);
    expect(theirs.status).toBe(200);
    expect(theirs.headers.get("idempotent-replayed")).toBeNull();
    expect(provider.jobs.length - jobsBefore).toBe(2);
    expect(await charges(account)).toMatchObject({ requests: 1, postings: 1 });
  });

  test("a key whose first request failed runs again", async () => {
    const account = await newAccount(gw, "paid", GRANT);
    const key = { "idempotency-key": "retry-after-failure" };
    gate.answer = (a) => a.end({ terminal_state: "provider_error" });
    expect((await chat(gw, account.apiKey, body, key)).status).toBe(503);
    gate.answer = honestAnswer;
    const second = await chat(gw, account.apiKey, body, key);
    expect(second.status).toBe(200);
    expect(second.headers.get("idempotent-replayed")).toBeNull();
  });
});
