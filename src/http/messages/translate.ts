// Messages request → the chat pipeline's NormalizedChat (pure; docs/facades.md). Everything the facade does
// not support is refused here, before any dispatch, with unsupported_content_shape naming the field.
import { gatewayError, type GatewayError } from "../errors.ts";
import type { NormalizeResult } from "../chat/normalize.ts";
import type { JobMessage, JobParams } from "../../wire/frames.ts";
import {
  textBlockChecker,
  toolResultBlockChecker,
  toolUseBlockChecker,
  type MessagesRequest,
  type ToolDefinition,
} from "./schema.ts";

/** The request headers the translation depends on. */
export interface MessagesHeaders {
  anthropicBeta: string | null;
}

type Block = { type: string } & Record<string, unknown>;

const unsupported = (param: string, message: string): GatewayError =>
  gatewayError("unsupported_content_shape", message, { param });
const invalid = (param: string, message: string): GatewayError => gatewayError("invalid_request", message, { param });

const MEDIA_BLOCKS = new Set(["image", "document", "file", "search_result", "container_upload"]);
const THINKING_BLOCKS = new Set(["thinking", "redacted_thinking"]);

/** Why a block the translation does not handle is refused. */
function refuseBlock(block: Block, param: string): GatewayError {
  if (MEDIA_BLOCKS.has(block.type)) {
    return unsupported(param, `Image, document and file content is not supported by /v1/messages (${param}).`);
  }
  if (THINKING_BLOCKS.has(block.type)) return unsupported(param, `Thinking blocks are not supported by /v1/messages (${param}).`);
  if (block.type.includes("tool")) return unsupported(param, `Server tools are not supported by /v1/messages (${param}).`);
  return unsupported(param, `Content blocks of type '${block.type}' are not supported by /v1/messages (${param}).`);
}

/** Text of a list of text blocks, joined with no separator (as chat content arrays are); or an error. */
function textOf(blocks: readonly Block[], param: string): string | GatewayError {
  let text = "";
  for (let i = 0; i < blocks.length; i++) {
    const block = blocks[i]!;
    if (block.type !== "text") return refuseBlock(block, `${param}[${i}]`);
    if (!textBlockChecker.Check(block)) return invalid(`${param}[${i}].text`, `Text blocks need a string 'text' (${param}[${i}]).`);
    text += block.text;
  }
  return text;
}

/** What a `tool_result` with `is_error: true` puts before its content in the chat tool message. */
export const TOOL_ERROR_PREFIX = "Error: ";

/** One user turn: its tool results become tool messages (first, in order), its text one user message. */
function userMessages(content: string | Block[], param: string): JobMessage[] | GatewayError {
  if (typeof content === "string") return [{ role: "user", content }];
  const out: JobMessage[] = [];
  let text = "";
  let sawText = false;
  for (let i = 0; i < content.length; i++) {
    const block = content[i]!;
    const at = `${param}[${i}]`;
    if (block.type === "text") {
      if (!textBlockChecker.Check(block)) return invalid(`${at}.text`, `Text blocks need a string 'text' (${at}).`);
      text += block.text;
      sawText = true;
    } else if (block.type === "tool_result") {
      if (!toolResultBlockChecker.Check(block)) {
        return invalid(at, `tool_result blocks need a string 'tool_use_id' and string or text-block 'content' (${at}).`);
      }
      const result = block.content === undefined ? "" : typeof block.content === "string" ? block.content : textOf(block.content as Block[], `${at}.content`);
      if (typeof result !== "string") return result;
      // Chat tool messages have no error flag, and upstream servers read only content: a failed tool
      // run is said in the text the model reads (docs/facades.md).
      const content = block.is_error === true ? `${TOOL_ERROR_PREFIX}${result}` : result;
      out.push({ role: "tool", content, tool_call_id: block.tool_use_id });
    } else return refuseBlock(block, at);
  }
  // A turn of tool results only has no user text; an empty turn stays an (empty) user message.
  if (sawText || out.length === 0) out.push({ role: "user", content: text });
  return out;
}

/** One assistant turn: text blocks joined into content, tool_use blocks into tool_calls. */
function assistantMessage(content: string | Block[], param: string): JobMessage | GatewayError {
  if (typeof content === "string") return { role: "assistant", content };
  let text = "";
  const calls: unknown[] = [];
  for (let i = 0; i < content.length; i++) {
    const block = content[i]!;
    const at = `${param}[${i}]`;
    if (block.type === "text") {
      if (!textBlockChecker.Check(block)) return invalid(`${at}.text`, `Text blocks need a string 'text' (${at}).`);
      text += block.text;
    } else if (block.type === "tool_use") {
      if (!toolUseBlockChecker.Check(block)) return invalid(at, `tool_use blocks need string 'id' and 'name' and an object 'input' (${at}).`);
      calls.push({ id: block.id, type: "function", function: { name: block.name, arguments: JSON.stringify(block.input) } });
    } else return refuseBlock(block, at);
  }
  const message: JobMessage = { role: "assistant", content: calls.length > 0 && text === "" ? null : text };
  if (calls.length > 0) message.tool_calls = calls;
  return message;
}

/** Client tools (input_schema) → function tools; any versioned server tool type is refused. */
function functionTools(tools: readonly ToolDefinition[]): unknown[] | GatewayError {
  const out: unknown[] = [];
  for (let i = 0; i < tools.length; i++) {
    const tool = tools[i]!;
    if (tool.type !== undefined && tool.type !== "custom") {
      return unsupported(`tools[${i}]`, `Server tools (type '${tool.type}') are not supported by /v1/messages (tools[${i}]).`);
    }
    if (tool.input_schema === undefined) return invalid(`tools[${i}].input_schema`, `Tools need an 'input_schema' (tools[${i}]).`);
    const fn: Record<string, unknown> = { name: tool.name, parameters: tool.input_schema };
    if (tool.description !== undefined) fn.description = tool.description;
    if (tool.strict !== undefined) fn.strict = tool.strict;
    out.push({ type: "function", function: fn });
  }
  return out;
}

function toolChoice(choice: NonNullable<MessagesRequest["tool_choice"]>): unknown | GatewayError {
  switch (choice.type) {
    case "auto":
      return "auto";
    case "any":
      return "required";
    case "none":
      return "none";
    case "tool":
      if (!choice.name) return invalid("tool_choice.name", "tool_choice of type 'tool' needs a 'name'.");
      return { type: "function", function: { name: choice.name } };
  }
}

const isError = (v: unknown): v is GatewayError =>
  typeof v === "object" && v !== null && "code" in v && "message" in v && !Array.isArray(v);

/**
 * Translates a schema-valid messages request into what the chat pipeline runs. Refuses (before any
 * dispatch) beta headers, thinking, top_k, server tools and every non-text content block; applies
 * the per-request token cap to max_tokens.
 */
export function translateMessagesRequest(body: MessagesRequest, headers: MessagesHeaders, requestTokenCap: number): NormalizeResult {
  const fail = (error: GatewayError): NormalizeResult => ({ ok: false, error });
  if (headers.anthropicBeta !== null) {
    return fail(unsupported("anthropic-beta", "Beta features (the anthropic-beta header) are not supported by /v1/messages."));
  }
  if (body.thinking !== undefined) return fail(unsupported("thinking", "Extended thinking is not supported by /v1/messages."));
  if (body.top_k !== undefined) return fail(unsupported("top_k", "top_k is not supported by /v1/messages."));
  if (body.mcp_servers !== undefined) return fail(unsupported("mcp_servers", "Server tools (MCP servers) are not supported by /v1/messages."));
  if (body.container !== undefined) return fail(unsupported("container", "Server tools (containers) are not supported by /v1/messages."));
  if (body.max_tokens !== undefined && body.max_tokens > requestTokenCap) {
    return fail(gatewayError("quota_exhausted_request_cap", `max_tokens may be at most ${requestTokenCap} per request.`, { param: "max_tokens" }));
  }

  const messages: JobMessage[] = [];
  if (body.system !== undefined) {
    const system = typeof body.system === "string" ? body.system : textOf(body.system as Block[], "system");
    if (typeof system !== "string") return fail(system);
    messages.push({ role: "system", content: system });
  }
  for (let i = 0; i < body.messages.length; i++) {
    const m = body.messages[i]!;
    const param = `messages[${i}].content`;
    const content = m.content as string | Block[];
    if (m.role === "user") {
      const turn = userMessages(content, param);
      if (isError(turn)) return fail(turn);
      messages.push(...turn);
    } else {
      const turn = assistantMessage(content, param);
      if (isError(turn)) return fail(turn);
      messages.push(turn);
    }
  }

  const params: JobParams = { max_tokens: body.max_tokens ?? requestTokenCap };
  if (body.temperature !== undefined) params.temperature = body.temperature;
  if (body.top_p !== undefined) params.top_p = body.top_p;
  if (body.stop_sequences !== undefined && body.stop_sequences.length > 0) params.stop = body.stop_sequences;
  if (body.tools !== undefined && body.tools.length > 0) {
    const tools = functionTools(body.tools);
    if (isError(tools)) return fail(tools);
    params.tools = tools;
    if (body.tool_choice !== undefined) {
      const choice = toolChoice(body.tool_choice);
      if (isError(choice)) return fail(choice);
      params.tool_choice = choice;
      if (body.tool_choice.disable_parallel_tool_use === true) params.parallel_tool_calls = false;
    }
  }

  return { ok: true, chat: { model: body.model, messages, params, stream: body.stream === true, includeUsage: false } };
}

/** The messages facade's stop_reason for a chat finish_reason. */
export function stopReason(finishReason: string): "end_turn" | "max_tokens" | "tool_use" | "refusal" {
  switch (finishReason) {
    case "length":
      return "max_tokens";
    case "tool_calls":
    case "function_call":
      return "tool_use";
    case "content_filter":
      return "refusal";
    default:
      return "end_turn";
  }
}
