// POST /v1/chat/completions request body. Unknown top-level fields are tolerated (SDKs add new ones
// often); known fields are type-checked; content shapes are checked by normalizeChatRequest.
import { Type, type Static } from "@sinclair/typebox";
import { TypeCompiler } from "@sinclair/typebox/compiler";
import { describeSchemaError } from "../schemaErrors.ts";

const ChatMessage = Type.Object({
  role: Type.Union([
    Type.Literal("system"),
    Type.Literal("developer"),
    Type.Literal("user"),
    Type.Literal("assistant"),
    Type.Literal("tool"),
  ]),
  content: Type.Optional(Type.Union([Type.String(), Type.Array(Type.Unknown()), Type.Null()])),
  name: Type.Optional(Type.String()),
  tool_call_id: Type.Optional(Type.String()),
  tool_calls: Type.Optional(Type.Array(Type.Unknown())),
});

export const ChatCompletionRequest = Type.Object({
  model: Type.String({ minLength: 1, maxLength: 256 }),
  messages: Type.Array(ChatMessage, { minItems: 1 }),
  stream: Type.Optional(Type.Union([Type.Boolean(), Type.Null()])),
  stream_options: Type.Optional(
    Type.Union([Type.Object({ include_usage: Type.Optional(Type.Union([Type.Boolean(), Type.Null()])) }), Type.Null()]),
  ),
  max_tokens: Type.Optional(Type.Union([Type.Integer({ minimum: 1 }), Type.Null()])),
  max_completion_tokens: Type.Optional(Type.Union([Type.Integer({ minimum: 1 }), Type.Null()])),
  temperature: Type.Optional(Type.Union([Type.Number({ minimum: 0, maximum: 2 }), Type.Null()])),
  top_p: Type.Optional(Type.Union([Type.Number({ minimum: 0, maximum: 1 }), Type.Null()])),
  stop: Type.Optional(Type.Union([Type.String(), Type.Array(Type.String(), { maxItems: 16 }), Type.Null()])),
  seed: Type.Optional(Type.Union([Type.Integer(), Type.Null()])),
  presence_penalty: Type.Optional(Type.Union([Type.Number({ minimum: -2, maximum: 2 }), Type.Null()])),
  frequency_penalty: Type.Optional(Type.Union([Type.Number({ minimum: -2, maximum: 2 }), Type.Null()])),
  response_format: Type.Optional(Type.Union([Type.Object({ type: Type.String() }), Type.Null()])),
  tools: Type.Optional(Type.Union([Type.Array(Type.Object({ type: Type.String() }), { maxItems: 128 }), Type.Null()])),
  tool_choice: Type.Optional(Type.Union([Type.String(), Type.Object({}), Type.Null()])),
  parallel_tool_calls: Type.Optional(Type.Union([Type.Boolean(), Type.Null()])),
  n: Type.Optional(Type.Union([Type.Integer(), Type.Null()])),
  logprobs: Type.Optional(Type.Union([Type.Boolean(), Type.Null()])),
  top_logprobs: Type.Optional(Type.Union([Type.Integer(), Type.Null()])),
  user: Type.Optional(Type.String()),
  metadata: Type.Optional(Type.Union([Type.Record(Type.String(), Type.String()), Type.Null()])),
});
export type ChatCompletionRequest = Static<typeof ChatCompletionRequest>;

export const chatCompletionRequestChecker = TypeCompiler.Compile(ChatCompletionRequest);

/** The first schema violation in plain words, and the field it concerns. */
export function describeChatSchemaError(body: unknown): { message: string; param: string | null } {
  return describeSchemaError(chatCompletionRequestChecker, body);
}
