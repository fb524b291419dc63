// The operator console's access rules on a real `gateway serve` process: the token from
// `gateway console token` (its last line), 401 without it or with a wrong one (never data), 200 with it
// as Bearer; the login form's session cookie (HttpOnly, SameSite=Strict); actions need the session's
// CSRF token; every action is logged; the token never appears in the logs.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { MAIN, tempDir, waitFor } from "../support/harness.ts";

describe("operator console access", () => {
  let dataDir: string;
  let proc: ReturnType<typeof Bun.spawn>;
  let base = "";
  let token = "";
  let logs = "";
  const decoder = new TextDecoder();

  beforeAll(async () => {
    dataDir = tempDir("gw-console-");
    proc = Bun.spawn(["bun", MAIN, "serve", "--demo", "--port", "0", "--data-dir", dataDir, "--log-level", "debug"], { stdout: "pipe", stderr: "pipe" });
    const read = async (stream: ReadableStream<Uint8Array>) => {
      for await (const bytes of stream) logs += decoder.decode(bytes, { stream: true });
    };
    void read(proc.stdout as ReadableStream<Uint8Array>);
    void read(proc.stderr as ReadableStream<Uint8Array>);
    const deadline = performance.now() + 20_000;
    while (!/ready on (http:\/\/\S+)/.test(logs)) {
      if (performance.now() > deadline) throw new Error(`gateway did not start:\n${logs}`);
      await Bun.sleep(20);
    }
    base = /ready on (http:\/\/\S+)/.exec(logs)![1]!;
    const cli = Bun.spawnSync(["bun", MAIN, "console", "token", "--data-dir", dataDir], { stdout: "pipe", stderr: "pipe", env: { ...process.env, GATEWAY_CONSOLE_TOKEN: "" } });
    expect(cli.exitCode).toBe(0);
    token = cli.stdout.toString().trim().split("\n").at(-1)!;
    expect(token.length).toBeGreaterThanOrEqual(40);
  }, 30_000);

  afterAll(async () => {
    proc?.kill("SIGTERM");
    await proc?.exited;
    rmSync(dataDir, { recursive: true, force: true });
  });

  const get = (path: string, headers: Record<string, string> = {}) => fetch(`${base}${path}`, { headers, redirect: "manual" });

  test("no token → 401, wrong token → 401, never data; the right token as Bearer → 200", async () => {
    for (const path of ["/console", "/console/api/state", "/console/api/machines", "/console/api/stream", "/console/api/actor?machine=request"]) {
      const none = await get(path);
      expect(none.status).toBe(401);
      const body = await none.text();
      expect(body).not.toContain("counts");
      expect(body).not.toContain("demo-provider");
      const wrong = await get(path, { authorization: `Bearer ${token.slice(0, -2)}xx` });
      expect(wrong.status).toBe(401);
      expect(await wrong.text()).not.toContain("counts");
    }
    // A browser without a session gets the login form as the 401's body.
    const form = await get("/console", { accept: "text/html" });
    expect(form.status).toBe(401);
    expect(await form.text()).toContain('action="/console/login"');

    const ok = await get("/console/api/state", { authorization: `Bearer ${token}` });
    expect(ok.status).toBe(200);
    const state = (await ok.json()) as { counts: Record<string, number>; gateway: { state: string } };
    expect(state.gateway.state).toBe("running");
    expect(state.counts.gateway).toBe(1);
    const machines = await get("/console/api/machines", { authorization: `Bearer ${token}` });
    expect(((await machines.json()) as { name: string }[]).map((m) => m.name)).toEqual(["gateway", "providerSession", "request", "settlement"]);
    // Assets carry no data and load without a token (the login form needs its stylesheet).
    expect((await get("/console/assets/console.css")).status).toBe(200);
    expect((await get("/console/assets/uPlot.js")).status).toBe(200);
  });

  test("the login form sets an HttpOnly SameSite=Strict session; actions with it need the CSRF token", async () => {
    const refused = await fetch(`${base}/console/login`, { method: "POST", body: new URLSearchParams({ token: "not-it" }), redirect: "manual" });
    expect(refused.status).toBe(401);
    const login = await fetch(`${base}/console/login`, { method: "POST", body: new URLSearchParams({ token }), redirect: "manual" });
    expect(login.status).toBe(303);
    const cookie = login.headers.get("set-cookie")!;
    expect(cookie).toMatch(/^gw_console=[A-Za-z0-9_-]{40,};/);
    expect(cookie).toContain("HttpOnly");
    expect(cookie).toContain("SameSite=Strict");
    expect(cookie).not.toContain(token);
    const session = cookie.split(";")[0]!;

    const page = await get("/console", { cookie: session });
    expect(page.status).toBe(200);
    const csrf = /name="csrf-token" content="([^"]+)"/.exec(await page.text())![1]!;
    expect(csrf.length).toBeGreaterThan(20);

    const action = (headers: Record<string, string>) =>
      fetch(`${base}/console/api/actions`, { method: "POST", headers: { cookie: session, "content-type": "application/json", ...headers }, body: JSON.stringify({ action: "revokeKey", keyId: "key_nope" }) });
    expect((await action({})).status).toBe(403);
    expect((await action({ "x-csrf-token": "wrong".repeat(9) })).status).toBe(403);
    expect((await action({ "x-csrf-token": csrf, origin: "http://evil.example" })).status).toBe(403);
    // Past the CSRF check, the action itself runs: an unknown key is a 404.
    const unknown = await action({ "x-csrf-token": csrf, origin: new URL(base).origin });
    expect(unknown.status).toBe(404);

    const out = await fetch(`${base}/console/logout`, { method: "POST", headers: { cookie: session, "x-csrf-token": csrf } });
    expect(out.status).toBe(204);
    expect((await get("/console/api/state", { cookie: session })).status).toBe(401);
  });

  test("Bearer actions: drain, ban and unban a live provider and revoke a key, each logged; the token never in the logs", async () => {
    const auth = { authorization: `Bearer ${token}`, "content-type": "application/json" };
    let state = (await (await get("/console/api/state", auth)).json()) as { providers: { providerId: string; state: string }[] };
    const deadline = performance.now() + 10_000;
    while (state.providers.length === 0 && performance.now() < deadline) {
      await Bun.sleep(50);
      state = (await (await get("/console/api/state", auth)).json()) as typeof state;
    }
    const providerId = state.providers[0]!.providerId;
    const act = (body: object) => fetch(`${base}/console/api/actions`, { method: "POST", headers: auth, body: JSON.stringify(body) });

    expect((await act({ action: "drain", providerId })).status).toBe(200);
    state = (await (await get("/console/api/state", auth)).json()) as typeof state;
    expect(state.providers.find((p) => p.providerId === providerId)?.state).toContain("draining");
    expect((await act({ action: "ban", providerId })).status).toBe(200);
    expect((await act({ action: "unban", providerId })).status).toBe(200);
    expect((await act({ action: "nonsense", providerId })).status).toBe(400);

    // The demo's key, listed by the CLI (which may wait out the serving process's write lock: retried).
    let listed = "";
    for (let i = 0; i < 5 && !listed; i++) {
      const keys = Bun.spawn(["bun", MAIN, "keys", "list", "--json", "--data-dir", dataDir], { stdout: "pipe", stderr: "pipe" });
      listed = (await new Response(keys.stdout).text()).trim();
      await keys.exited;
    }
    const keyId = (JSON.parse(listed.split("\n")[0]!) as { key_id: string }).key_id;
    expect((await act({ action: "revokeKey", keyId })).status).toBe(200);

    const actions = () => logs.split("\n").filter((l) => l.includes('"console_action"'));
    await waitFor(() => actions().length >= 5, 5000, "the five console_action lines"); // the log writer flushes once per event-loop turn
    expect(actions().map((l) => (JSON.parse(l) as { action: string }).action)).toEqual(["revokeKey", "drain", "ban", "unban", "revokeKey"]);
    expect(logs).toContain("console_login");
    expect(logs).not.toContain(token);
  });
});
