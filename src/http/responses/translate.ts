// Responses request → the chat pipeline's NormalizedChat (pure; docs/facades.md). The facade is stateless:
// the full input comes with every request. Stateful or unoffered parameters are refused here, before
// any dispatch, with unsupported_parameter naming them; hosted and unknown tools are dropped.
import { gatewayError, type GatewayError } from "../errors.ts";
import type { NormalizedChat } from "../../chat/contract.ts";
import type { JobMessage, JobParams } from "../../wire/frames.ts";
import {
  functionCallItemChecker,
  functionCallOutputItemChecker,
  functionToolChecker,
  messageItemChecker,
  refusalPartChecker,
  textPartChecker,
  type FunctionTool,
  type ResponsesRequest,
} from "./schema.ts";

/** Request fields a response object echoes back (what the gateway actually applied). */
export interface ResponseEcho {
  instructions: string | null;
  max_output_tokens: number | null;
  temperature: number | null;
  top_p: number | null;
  tools: FunctionTool[];
  tool_choice: unknown;
  text: { format: unknown };
  parallel_tool_calls: boolean;
  metadata: Record<string, string>;
}

export type TranslateResponsesResult = { ok: true; chat: NormalizedChat; echo: ResponseEcho } | { ok: false; error: GatewayError };

type Part = { type: string } & Record<string, unknown>;
type Item = { type?: string } & Record<string, unknown>;

const refuse = (param: string, message: string): GatewayError => gatewayError("unsupported_parameter", message, { param });
const invalid = (param: string, message: string): GatewayError => gatewayError("invalid_request", message, { param });
const isError = (v: unknown): v is GatewayError => typeof v === "object" && v !== null && !Array.isArray(v) && "code" in v && "message" in v;

/** Stateful or unoffered parameters, checked in this order; the first present one is refused. */
function refusedParameter(body: ResponsesRequest): GatewayError | null {
  if (body.previous_response_id != null) {
    return refuse("previous_response_id", "previous_response_id is not supported: /v1/responses is stateless, so send the full input every time.");
  }
  if (body.conversation != null) return refuse("conversation", "conversation is not supported: /v1/responses is stateless, so send the full input every time.");
  if (body.store === true) return refuse("store", "store: true is not supported: /v1/responses stores nothing. Omit store or set it to false.");
  if (body.background === true) return refuse("background", "background: true is not supported by /v1/responses.");
  if (body.truncation != null && body.truncation !== "disabled") {
    return refuse("truncation", "Only truncation 'disabled' is supported by /v1/responses.");
  }
  if (body.response_format != null) {
    return refuse("response_format", "response_format is not a /v1/responses parameter: use text.format for structured output.");
  }
  if (body.prompt != null) return refuse("prompt", "Stored prompt templates are not supported by /v1/responses: send instructions and input instead.");
  if (body.top_logprobs != null) return refuse("top_logprobs", "top_logprobs is not supported by /v1/responses.");
  return null;
}

/** Text of a message's content parts (text and refusal parts), joined with no separator. */
function textOfParts(parts: readonly Part[], param: string, what: string): string | GatewayError {
  let text = "";
  for (let j = 0; j < parts.length; j++) {
    const part = parts[j]!;
    const at = `${param}[${j}]`;
    if (part.type === "input_text" || part.type === "output_text") {
      if (!textPartChecker.Check(part)) return invalid(`${at}.text`, `Text parts need a string 'text' (${at}).`);
      text += part.text;
    } else if (part.type === "refusal") {
      if (!refusalPartChecker.Check(part)) return invalid(`${at}.refusal`, `Refusal parts need a string 'refusal' (${at}).`);
      text += part.refusal;
    } else {
      return refuse(at, `Only text ${what} is supported by /v1/responses (${at} is '${part.type}').`);
    }
  }
  return text;
}

/** Input items → chat messages; function_call items join the assistant turn they follow. */
function inputMessages(input: NonNullable<ResponsesRequest["input"]>): JobMessage[] | GatewayError {
  if (typeof input === "string") return [{ role: "user", content: input }];
  const out: JobMessage[] = [];
  for (let i = 0; i < input.length; i++) {
    const item = input[i] as Item;
    const at = `input[${i}]`;
    const type = item.type ?? "message";
    if (type === "message") {
      if (!messageItemChecker.Check(item)) return invalid(at, `Message items need a role and string or part-list content (${at}).`);
      const content = typeof item.content === "string" ? item.content : textOfParts(item.content as Part[], `${at}.content`, "input");
      if (isError(content)) return content;
      const role = item.role === "developer" ? "system" : item.role;
      out.push({ role, content });
    } else if (type === "function_call") {
      if (!functionCallItemChecker.Check(item)) return invalid(at, `function_call items need string call_id, name and arguments (${at}).`);
      const call = { id: item.call_id, type: "function", function: { name: item.name, arguments: item.arguments } };
      const last = out.at(-1);
      // Invariant: tool messages follow the assistant message that holds their calls.
      if (last?.role === "assistant") last.tool_calls = [...(last.tool_calls ?? []), call];
      else out.push({ role: "assistant", content: null, tool_calls: [call] });
    } else if (type === "function_call_output") {
      if (!functionCallOutputItemChecker.Check(item)) {
        return invalid(at, `function_call_output items need a string call_id and a string or text-part output (${at}).`);
      }
      const output = typeof item.output === "string" ? item.output : textOfParts(item.output as Part[], `${at}.output`, "output");
      if (isError(output)) return output;
      out.push({ role: "tool", content: output, tool_call_id: item.call_id });
    } else {
      return refuse(at, `Input items of type '${type}' are not supported by /v1/responses: send message, function_call and function_call_output items.`);
    }
  }
  return out;
}

/** Function tools, kept in order; hosted and unknown tool types are dropped. */
function keptTools(tools: readonly { type: string }[]): FunctionTool[] | GatewayError {
  const kept: FunctionTool[] = [];
  for (let i = 0; i < tools.length; i++) {
    const tool = tools[i]!;
    if (tool.type !== "function") continue;
    if (!functionToolChecker.Check(tool)) return invalid(`tools[${i}]`, `Function tools need a string 'name' (tools[${i}]).`);
    kept.push(tool);
  }
  return kept;
}

const chatTool = (tool: FunctionTool) => {
  const fn: Record<string, unknown> = { name: tool.name, parameters: tool.parameters ?? { type: "object", properties: {} } };
  if (tool.description != null) fn.description = tool.description;
  if (tool.strict != null) fn.strict = tool.strict;
  return { type: "function", function: fn };
};

/** tool_choice → chat's; a choice of a hosted tool is dropped along with the tool. */
function chatToolChoice(choice: NonNullable<ResponsesRequest["tool_choice"]>): unknown | GatewayError | undefined {
  if (typeof choice === "string") {
    if (choice === "auto" || choice === "none" || choice === "required") return choice;
    return invalid("tool_choice", "tool_choice must be 'auto', 'none', 'required' or a function.");
  }
  if (choice.type === "function") {
    if (!choice.name) return invalid("tool_choice.name", "A function tool_choice needs a 'name'.");
    return { type: "function", function: { name: choice.name } };
  }
  return undefined;
}

/** text.format → chat's response_format (undefined for plain text). */
function responseFormat(format: NonNullable<NonNullable<ResponsesRequest["text"]>["format"]>): unknown | GatewayError | undefined {
  switch (format.type) {
    case "text":
      return undefined;
    case "json_object":
      return { type: "json_object" };
    case "json_schema": {
      if (!format.name) return invalid("text.format.name", "A json_schema text.format needs a 'name'.");
      if (!format.schema) return invalid("text.format.schema", "A json_schema text.format needs a 'schema'.");
      const jsonSchema: Record<string, unknown> = { name: format.name, schema: format.schema };
      if (format.description !== undefined) jsonSchema.description = format.description;
      if (format.strict != null) jsonSchema.strict = format.strict;
      return { type: "json_schema", json_schema: jsonSchema };
    }
    default:
      return refuse("text.format", `text.format type '${format.type}' is not supported by /v1/responses.`);
  }
}

/**
 * Translates a schema-valid responses request into what the chat pipeline runs, plus the fields the
 * response object echoes. Tolerated without effect: include, reasoning controls, parallel_tool_calls,
 * metadata, user.
 */
export function translateResponsesRequest(body: ResponsesRequest, requestTokenCap: number): TranslateResponsesResult {
  const fail = (error: GatewayError): TranslateResponsesResult => ({ ok: false, error });
  const refused = refusedParameter(body);
  if (refused) return fail(refused);
  if (body.max_output_tokens != null && body.max_output_tokens > requestTokenCap) {
    return fail(
      gatewayError("quota_exhausted_request_cap", `max_output_tokens may be at most ${requestTokenCap} per request.`, { param: "max_output_tokens" }),
    );
  }
  if (body.input === undefined) return fail(invalid("input", "input is required: /v1/responses is stateless, so send the full input every time."));

  const messages: JobMessage[] = [];
  if (body.instructions != null) messages.push({ role: "system", content: body.instructions });
  const fromInput = inputMessages(body.input);
  if (isError(fromInput)) return fail(fromInput);
  messages.push(...fromInput);
  if (messages.length === 0) return fail(invalid("input", "input must hold at least one item."));

  const params: JobParams = { max_tokens: body.max_output_tokens ?? requestTokenCap };
  if (body.temperature != null) params.temperature = body.temperature;
  if (body.top_p != null) params.top_p = body.top_p;
  const tools = keptTools(body.tools ?? []);
  if (isError(tools)) return fail(tools);
  let toolChoice: unknown = "auto";
  if (tools.length > 0) {
    params.tools = tools.map(chatTool);
    if (body.tool_choice != null) {
      const choice = chatToolChoice(body.tool_choice);
      if (isError(choice)) return fail(choice);
      if (choice !== undefined) {
        params.tool_choice = choice;
        toolChoice = body.tool_choice;
      }
    }
  }
  const format = body.text?.format;
  if (format !== undefined) {
    const rf = responseFormat(format);
    if (isError(rf)) return fail(rf);
    if (rf !== undefined) params.response_format = rf;
  }

  return {
    ok: true,
    chat: { model: body.model, messages, params, stream: body.stream === true, includeUsage: false },
    echo: {
      instructions: body.instructions ?? null,
      max_output_tokens: body.max_output_tokens ?? null,
      temperature: body.temperature ?? null,
      top_p: body.top_p ?? null,
      tools,
      tool_choice: toolChoice,
      text: { format: format ?? { type: "text" } },
      parallel_tool_calls: body.parallel_tool_calls ?? true,
      metadata: body.metadata ?? {},
    },
  };
}
