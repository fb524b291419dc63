// GET /v1/models/{id}: the openai SDK's models.retrieve() gets the model in the OpenAI shape, with
// what a request for it is charged; an unknown id is a 404 the SDK raises as NotFoundError.
import { afterAll, beforeAll, expect, test } from "bun:test";
import OpenAI from "openai";
import { catalogModel, spawnProvider, startTestGateway, waitForReadyProviders, type ProviderProcess, type TestGateway } from "../support/harness.ts";

let gw: TestGateway;
let provider: ProviderProcess;
let client: OpenAI;

beforeAll(async () => {
  gw = await startTestGateway(
    {
      settlementMode: "enforce",
      rateCard: JSON.stringify([{ slug: "premium", prompt_credits_per_million: 2_000_000, completion_credits_per_million: 3_000_000 }]),
    },
    { catalog: ["plain-model", catalogModel("org/premium-model", { rate_card_row: "premium" })] },
  );
  provider = spawnProvider(gw, { id: "p-models", models: ["plain-model", "org/premium-model", "uncatalogued"] });
  await waitForReadyProviders(gw, 1);
  client = new OpenAI({ apiKey: gw.apiKey, baseURL: gw.baseURL, maxRetries: 0 });
});

afterAll(async () => {
  await provider?.kill();
  await gw?.close();
});

test("models.retrieve() returns the model in the OpenAI shape with its price", async () => {
  const model = await client.models.retrieve("plain-model");
  expect(model).toMatchObject({ id: "plain-model", object: "model", created: 0, owned_by: "provider-network" });
  expect((model as unknown as { pricing: unknown }).pricing).toEqual({
    rate_card_row: "default",
    prompt_credits_per_million_tokens: 1_000_000,
    completion_credits_per_million_tokens: 1_000_000,
    prompt_usd_per_million_tokens: 1,
    completion_usd_per_million_tokens: 1,
  });
});

test("an id holding '/' works, and is priced at its catalog entry's row", async () => {
  const model = await client.models.retrieve("org/premium-model");
  expect(model.id).toBe("org/premium-model");
  expect((model as unknown as { pricing: { rate_card_row: string; completion_usd_per_million_tokens: number } }).pricing).toMatchObject({
    rate_card_row: "premium",
    completion_usd_per_million_tokens: 3,
  });
});

test("the list and one model agree", async () => {
  const list = await client.models.list();
  const ids = list.data.map((m) => m.id);
  expect(ids).toEqual(["org/premium-model", "plain-model"]);
  for (const id of ids) expect(await client.models.retrieve(id)).toEqual(list.data.find((m) => m.id === id)!);
});

test("an unknown id, or one enforce mode would not route, is a 404 NotFoundError in the error envelope", async () => {
  for (const id of ["no-such-model", "uncatalogued"]) {
    const error = await client.models.retrieve(id).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(OpenAI.NotFoundError);
    expect((error as InstanceType<typeof OpenAI.NotFoundError>).error).toMatchObject({ code: "model_not_available", param: "model", type: "not_found_error" });
    expect((error as Error).message).toContain(`'${id}'`);
  }
});

test("without a key it is 401, as /v1/models is", async () => {
  const res = await fetch(`${gw.baseURL}/models/plain-model`);
  expect(res.status).toBe(401);
});
