// The rendered API reference's script, from the @scalar/api-reference npm package and served by the
// gateway itself (no CDN: /docs works offline). `type: "file"` embeds it in the single binary too.
// @ts-expect-error -- a plain JavaScript asset imported as a file path, not as a module
import scalarStandalone from "../../../node_modules/@scalar/api-reference/dist/browser/standalone.js" with { type: "file" };

export const SCALAR_SCRIPT_PATH: string = scalarStandalone;
