// Every 400 for a malformed body says in plain words which field is wrong and what it allows; the
// words come from the schema the route validates with.
import { describe, expect, test } from "bun:test";
import { TypeCompiler } from "@sinclair/typebox/compiler";
import { describeChatSchemaError } from "../../src/http/chat/schema.ts";
import { messagesRequestChecker } from "../../src/http/messages/schema.ts";
import { responsesRequestChecker } from "../../src/http/responses/schema.ts";
import { FeedbackRequest } from "../../src/http/feedback.ts";
import { describeSchemaError, paramOf } from "../../src/http/schemaErrors.ts";

const m = [{ role: "user", content: "hi" }];

describe("chat completions", () => {
  test.each([
    [{}, "'model' is required.", "model"],
    [{ model: "x" }, "'messages' is required.", "messages"],
    [{ model: "x", messages: [] }, "'messages' must be a non-empty array of objects.", "messages"],
    [{ model: "x", messages: "hi" }, "'messages' must be a non-empty array of objects.", "messages"],
    [{ model: "x", messages: m, temperature: 3 }, "'temperature' must be a number between 0 and 2.", "temperature"],
    [{ model: "x", messages: m, temperature: "hot" }, "'temperature' must be a number between 0 and 2.", "temperature"],
    [{ model: "x", messages: m, top_p: -1 }, "'top_p' must be a number between 0 and 1.", "top_p"],
    [{ model: "", messages: m }, "'model' must be a non-empty string of at most 256 characters.", "model"],
    [{ model: "x", messages: [{ role: "robot", content: "x" }] }, "'messages[0].role' must be one of 'system', 'developer', 'user', 'assistant' or 'tool'.", "messages[0].role"],
    [{ model: "x", messages: [{ content: "x" }] }, "'messages[0].role' is required.", "messages[0].role"],
    [{ model: "x", messages: [5] }, "'messages[0]' must be an object.", "messages[0]"],
    [{ model: "x", messages: m, stop: 5 }, "'stop' must be a string or an array of at most 16 strings.", "stop"],
    [{ model: "x", messages: m, stop: ["a", 1] }, "'stop[1]' must be a string.", "stop[1]"],
    [{ model: "x", messages: m, max_tokens: 0 }, "'max_tokens' must be an integer of at least 1.", "max_tokens"],
    [{ model: "x", messages: m, n: 1.5 }, "'n' must be an integer.", "n"],
    [{ model: "x", messages: m, stream: "yes" }, "'stream' must be true or false.", "stream"],
    [{ model: "x", messages: m, metadata: { a: 1 } }, "'metadata.a' must be a string.", "metadata.a"],
    [{ model: "x", messages: m, tools: [{}] }, "'tools[0].type' is required.", "tools[0].type"],
    [{ model: "x", messages: m, stream_options: { include_usage: "y" } }, "'stream_options.include_usage' must be true or false.", "stream_options.include_usage"],
    [{ model: "x", messages: m, tool_choice: 5 }, "'tool_choice' must be a string or an object.", "tool_choice"],
    [[], "The request body must be a JSON object.", null],
  ] as const)("%j → %s", (body, message, param) => {
    expect(describeChatSchemaError(body)).toEqual({ message, param });
  });
});

test("the facades and feedback speak the same way", () => {
  expect(describeSchemaError(messagesRequestChecker, { model: "x", messages: m, temperature: 1.5 }).message).toBe("'temperature' must be a number between 0 and 1.");
  expect(describeSchemaError(messagesRequestChecker, { model: "x" }).message).toBe("'messages' is required.");
  expect(describeSchemaError(messagesRequestChecker, { model: "x", messages: [{ role: "system", content: "x" }] }).message).toBe(
    "'messages[0].role' must be one of 'user' or 'assistant'.",
  );
  expect(describeSchemaError(responsesRequestChecker, {}).message).toBe("'model' is required.");
  const feedback = TypeCompiler.Compile(FeedbackRequest);
  expect(describeSchemaError(feedback, { request_id: "r", rating: "meh" }).message).toBe("'rating' must be one of 'up' or 'down'.");
  expect(describeSchemaError(feedback, { request_id: "r", rating: "up", extra: 1 }).message).toBe("'extra' is not a field this endpoint accepts.");
});

test("no message is TypeBox's own wording", () => {
  const bodies: unknown[] = [{ model: 1, messages: {} }, { model: "x", messages: [{ role: 1 }] }, { model: "x", messages: m, seed: "s" }, null, 5];
  for (const body of bodies) expect(describeChatSchemaError(body).message).not.toMatch(/expected|union|property/i);
});

test("JSON Pointer escapes are undone in the field name", () => {
  expect(paramOf("/metadata/a~1b/0")).toBe("metadata.a/b[0]");
});
