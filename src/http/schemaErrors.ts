// Plain words for a TypeBox schema violation, shared by every route that validates a body: which field
// is wrong and what it allows ("'temperature' must be a number between 0 and 2", "'messages' is
// required"). What is allowed is read from the schema itself, so the text cannot drift from the check.
import { Kind, OptionalKind, type TSchema } from "@sinclair/typebox";
import type { TypeCheck } from "@sinclair/typebox/compiler";
import { ValueErrorType, type ValueError } from "@sinclair/typebox/errors";

/** The JSON Pointer of an error as buyers write fields: `messages[0].content`; null for the body. */
export function paramOf(path: string): string | null {
  return path.replace(/^\//, "").replace(/\/(\d+)(?=\/|$)/g, "[$1]").replace(/\//g, ".").replace(/~1/g, "/").replace(/~0/g, "~") || null;
}

const quote = (value: unknown) => (typeof value === "string" ? `'${value}'` : JSON.stringify(value));

/** "a, b or c" */
function either(words: readonly string[]): string {
  const unique = [...new Set(words)];
  return unique.length <= 1 ? (unique[0] ?? "") : `${unique.slice(0, -1).join(", ")} or ${unique.at(-1)}`;
}

function range(min: number | undefined, max: number | undefined): string {
  if (min !== undefined && max !== undefined) return ` between ${min} and ${max}`;
  if (min !== undefined) return ` of at least ${min}`;
  if (max !== undefined) return ` of at most ${max}`;
  return "";
}

/** The plural noun of an array's items ("strings", "objects"), or null when any item is allowed. */
function itemsNoun(items: TSchema | undefined): string | null {
  switch (items?.[Kind]) {
    case "String":
      return "strings";
    case "Number":
      return "numbers";
    case "Integer":
      return "integers";
    case "Boolean":
      return "booleans";
    case "Object":
    case "Record":
      return "objects";
    default:
      return null;
  }
}

/** What `schema` allows, as a noun phrase ("a number between 0 and 2"); null is left unsaid. */
export function describeAllowed(schema: TSchema): string {
  switch (schema[Kind]) {
    case "Union": {
      const variants = (schema.anyOf as TSchema[]).filter((s) => s[Kind] !== "Null");
      if (variants.length > 0 && variants.every((s) => s[Kind] === "Literal")) return `one of ${either(variants.map((s) => quote(s.const)))}`;
      return either(variants.map(describeAllowed));
    }
    case "Literal":
      return quote(schema.const);
    case "String": {
      const min = schema.minLength as number | undefined;
      const max = schema.maxLength as number | undefined;
      const base = min === 1 ? "a non-empty string" : "a string";
      if (max !== undefined) return `${base} of at most ${max} characters`;
      if (min !== undefined && min > 1) return `a string of at least ${min} characters`;
      return base;
    }
    case "Number":
      return `a number${range(schema.minimum as number | undefined, schema.maximum as number | undefined)}`;
    case "Integer":
      return `an integer${range(schema.minimum as number | undefined, schema.maximum as number | undefined)}`;
    case "Boolean":
      return "true or false";
    case "Null":
      return "null";
    case "Array": {
      const noun = itemsNoun(schema.items as TSchema | undefined);
      const min = schema.minItems as number | undefined;
      const max = schema.maxItems as number | undefined;
      const base = min !== undefined && min >= 1 ? "a non-empty array" : "an array";
      const of = noun ? ` of ${noun}` : "";
      return max !== undefined ? `${base} of at most ${max} ${noun ?? "items"}` : `${base}${of}`;
    }
    case "Object":
      return "an object";
    case "Record":
      return schema.patternProperties && Object.values(schema.patternProperties as Record<string, TSchema>)[0]?.[Kind] === "String"
        ? "an object of string values"
        : "an object";
    default:
      return "a valid value";
  }
}

/**
 * A union's error stands for "none of the alternatives matched". When the value has one
 * alternative's shape and only something inside it is wrong (`tools: [{}]`), that inner error is the
 * one worth naming.
 */
function innermost(error: ValueError): ValueError {
  if (error.type !== ValueErrorType.Union) return error;
  for (const alternative of error.errors) {
    const first = alternative.First();
    if (first && first.path.length > error.path.length) return innermost(first);
  }
  return error;
}

/** The plain sentence for one violation, and the field it concerns. */
export function describeViolation(violation: ValueError): { message: string; param: string | null } {
  const error = innermost(violation);
  const param = paramOf(error.path);
  if (param === null) return { message: "The request body must be a JSON object.", param: null };
  const field = `'${param}'`;
  if (error.type === ValueErrorType.ObjectAdditionalProperties) {
    return { message: `${field} is not a field this endpoint accepts.`, param };
  }
  if (error.value === undefined && (error.type === ValueErrorType.ObjectRequiredProperty || !(OptionalKind in error.schema))) {
    return { message: `${field} is required.`, param };
  }
  return { message: `${field} must be ${describeAllowed(error.schema)}.`, param };
}

/** The first violation of `body` against `checker`'s schema, in plain words. */
export function describeSchemaError<T extends TSchema>(checker: TypeCheck<T>, body: unknown): { message: string; param: string | null } {
  const first = checker.Errors(body).First();
  if (!first) return { message: "The request body is not valid.", param: null };
  return describeViolation(first);
}
