// POST /v1/responses request body and its input items. Unknown top-level fields are tolerated (SDKs
// add new ones often), like chat completions; known fields are type-checked here, and which items,
// tools and parameters are supported is decided by translateResponsesRequest.
import { Type, type Static, type TSchema } from "@sinclair/typebox";
import { TypeCompiler } from "@sinclair/typebox/compiler";

const Nullable = <T extends TSchema>(t: T) => Type.Optional(Type.Union([t, Type.Null()]));

/** Any content part: its `type` decides whether it is text (input_text, output_text, refusal). */
const AnyPart = Type.Object({ type: Type.String() });

/** A message item (`type: "message"`, or the short form without `type`). */
export const MessageItem = Type.Object({
  type: Type.Optional(Type.Literal("message")),
  role: Type.Union([Type.Literal("user"), Type.Literal("assistant"), Type.Literal("system"), Type.Literal("developer")]),
  content: Type.Union([Type.String(), Type.Array(AnyPart)]),
});
export type MessageItem = Static<typeof MessageItem>;

export const FunctionCallItem = Type.Object({
  type: Type.Literal("function_call"),
  call_id: Type.String({ minLength: 1, maxLength: 256 }),
  name: Type.String({ minLength: 1, maxLength: 256 }),
  arguments: Type.String(),
});
export type FunctionCallItem = Static<typeof FunctionCallItem>;

export const FunctionCallOutputItem = Type.Object({
  type: Type.Literal("function_call_output"),
  call_id: Type.String({ minLength: 1, maxLength: 256 }),
  output: Type.Union([Type.String(), Type.Array(AnyPart)]),
});
export type FunctionCallOutputItem = Static<typeof FunctionCallOutputItem>;

export const TextPart = Type.Object({
  type: Type.Union([Type.Literal("input_text"), Type.Literal("output_text")]),
  text: Type.String(),
});
export const RefusalPart = Type.Object({ type: Type.Literal("refusal"), refusal: Type.String() });

export const FunctionTool = Type.Object({
  type: Type.Literal("function"),
  name: Type.String({ minLength: 1, maxLength: 256 }),
  description: Nullable(Type.String()),
  parameters: Nullable(Type.Object({})),
  strict: Nullable(Type.Boolean()),
});
export type FunctionTool = Static<typeof FunctionTool>;

export const TextFormat = Type.Object({
  type: Type.String(),
  name: Type.Optional(Type.String()),
  schema: Type.Optional(Type.Object({})),
  description: Type.Optional(Type.String()),
  strict: Nullable(Type.Boolean()),
});
export type TextFormat = Static<typeof TextFormat>;

export const ResponsesRequest = Type.Object({
  model: Type.String({ minLength: 1, maxLength: 256 }),
  input: Type.Optional(Type.Union([Type.String(), Type.Array(Type.Object({ type: Type.Optional(Type.String()) }))])),
  instructions: Nullable(Type.String()),
  stream: Nullable(Type.Boolean()),
  max_output_tokens: Nullable(Type.Integer({ minimum: 1 })),
  temperature: Nullable(Type.Number({ minimum: 0, maximum: 2 })),
  top_p: Nullable(Type.Number({ minimum: 0, maximum: 1 })),
  // Tools of any type are accepted here: hosted and unknown ones are dropped by the translator.
  tools: Nullable(Type.Array(Type.Object({ type: Type.String() }), { maxItems: 128 })),
  tool_choice: Nullable(Type.Union([Type.String(), Type.Object({ type: Type.String(), name: Type.Optional(Type.String()) })])),
  text: Nullable(Type.Object({ format: Type.Optional(TextFormat) })),
  // Tolerated without effect.
  include: Nullable(Type.Array(Type.String())),
  reasoning: Nullable(Type.Object({})),
  parallel_tool_calls: Nullable(Type.Boolean()),
  metadata: Nullable(Type.Record(Type.String(), Type.String())),
  user: Nullable(Type.String()),
  // Refused by value in the translator (stateful or not offered); typed loosely so the refusal names them.
  store: Nullable(Type.Boolean()),
  background: Nullable(Type.Boolean()),
  previous_response_id: Type.Optional(Type.Unknown()),
  conversation: Type.Optional(Type.Unknown()),
  truncation: Type.Optional(Type.Unknown()),
  response_format: Type.Optional(Type.Unknown()),
  prompt: Type.Optional(Type.Unknown()),
  top_logprobs: Type.Optional(Type.Unknown()),
});
export type ResponsesRequest = Static<typeof ResponsesRequest>;

export const responsesRequestChecker = TypeCompiler.Compile(ResponsesRequest);
export const messageItemChecker = TypeCompiler.Compile(MessageItem);
export const functionCallItemChecker = TypeCompiler.Compile(FunctionCallItem);
export const functionCallOutputItemChecker = TypeCompiler.Compile(FunctionCallOutputItem);
export const textPartChecker = TypeCompiler.Compile(TextPart);
export const refusalPartChecker = TypeCompiler.Compile(RefusalPart);
export const functionToolChecker = TypeCompiler.Compile(FunctionTool);
