// POST /v1/messages request body and its content blocks. Unknown top-level fields are tolerated (SDKs
// add new ones often), like chat completions; known fields are type-checked here, and which block
// types and features are supported is decided by translateMessagesRequest (unsupported → the
// facade's unsupported_content_shape, not a schema error).
import { Type, type Static } from "@sinclair/typebox";
import { TypeCompiler } from "@sinclair/typebox/compiler";

/** Any content block: its `type` picks the block schema below. */
const AnyBlock = Type.Object({ type: Type.String() });

export const TextBlock = Type.Object({ type: Type.Literal("text"), text: Type.String() });
export type TextBlock = Static<typeof TextBlock>;

export const ToolUseBlock = Type.Object({
  type: Type.Literal("tool_use"),
  id: Type.String({ minLength: 1, maxLength: 256 }),
  name: Type.String({ minLength: 1, maxLength: 256 }),
  input: Type.Record(Type.String(), Type.Unknown()),
});
export type ToolUseBlock = Static<typeof ToolUseBlock>;

export const ToolResultBlock = Type.Object({
  type: Type.Literal("tool_result"),
  tool_use_id: Type.String({ minLength: 1, maxLength: 256 }),
  content: Type.Optional(Type.Union([Type.String(), Type.Array(AnyBlock)])),
  is_error: Type.Optional(Type.Boolean()),
});
export type ToolResultBlock = Static<typeof ToolResultBlock>;

const Message = Type.Object({
  role: Type.Union([Type.Literal("user"), Type.Literal("assistant")]),
  content: Type.Union([Type.String(), Type.Array(AnyBlock)]),
});

/** A tool definition: a client tool has `input_schema`; a server tool has a versioned `type`. */
export const ToolDefinition = Type.Object({
  type: Type.Optional(Type.String()),
  name: Type.String({ minLength: 1, maxLength: 256 }),
  description: Type.Optional(Type.String()),
  input_schema: Type.Optional(Type.Object({})),
  strict: Type.Optional(Type.Boolean()),
});
export type ToolDefinition = Static<typeof ToolDefinition>;

export const ToolChoice = Type.Object({
  type: Type.Union([Type.Literal("auto"), Type.Literal("any"), Type.Literal("tool"), Type.Literal("none")]),
  name: Type.Optional(Type.String({ minLength: 1 })),
  disable_parallel_tool_use: Type.Optional(Type.Boolean()),
});

export const MessagesRequest = Type.Object({
  model: Type.String({ minLength: 1, maxLength: 256 }),
  messages: Type.Array(Message, { minItems: 1 }),
  system: Type.Optional(Type.Union([Type.String(), Type.Array(AnyBlock)])),
  max_tokens: Type.Optional(Type.Integer({ minimum: 1 })),
  stream: Type.Optional(Type.Boolean()),
  stop_sequences: Type.Optional(Type.Array(Type.String(), { maxItems: 16 })),
  temperature: Type.Optional(Type.Number({ minimum: 0, maximum: 1 })),
  top_p: Type.Optional(Type.Number({ minimum: 0, maximum: 1 })),
  tools: Type.Optional(Type.Array(ToolDefinition, { maxItems: 128 })),
  tool_choice: Type.Optional(ToolChoice),
  metadata: Type.Optional(Type.Object({})),
  // Refused by the translator whatever their value; typed loosely so the refusal names them.
  top_k: Type.Optional(Type.Unknown()),
  thinking: Type.Optional(Type.Unknown()),
  mcp_servers: Type.Optional(Type.Unknown()),
  container: Type.Optional(Type.Unknown()),
});
export type MessagesRequest = Static<typeof MessagesRequest>;

export const messagesRequestChecker = TypeCompiler.Compile(MessagesRequest);
export const textBlockChecker = TypeCompiler.Compile(TextBlock);
export const toolUseBlockChecker = TypeCompiler.Compile(ToolUseBlock);
export const toolResultBlockChecker = TypeCompiler.Compile(ToolResultBlock);
