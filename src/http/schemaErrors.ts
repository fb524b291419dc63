// A short, buyer-safe description of a TypeBox schema violation, shared by the facades' routes.
import type { TSchema } from "@sinclair/typebox";
import type { TypeCheck } from "@sinclair/typebox/compiler";

/** The first violation as a message and the field it concerns (`messages[0].content`, or null). */
export function describeSchemaError<T extends TSchema>(checker: TypeCheck<T>, body: unknown): { message: string; param: string | null } {
  const first = checker.Errors(body).First();
  if (!first) return { message: "Invalid request body.", param: null };
  const param = first.path.replace(/^\//, "").replace(/\/(\d+)/g, "[$1]").replace(/\//g, ".") || null;
  return { message: `Invalid value for '${param ?? "body"}': ${first.message.toLowerCase()}.`, param };
}
