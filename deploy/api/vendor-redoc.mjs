// Copies Redoc's standalone bundle and license notices from the npm package
// pinned in package-lock.json (node_modules/redoc) into internal/httpapi/docs,
// where the service embeds them. With --check it only verifies that the
// vendored files are exactly what this would write (make api-lint runs it).
//
// One change is made to the bundle: the side menu's footer shows Redocly's
// logo from https://cdn.redoc.ly, the page's only request to another host,
// which the docs page's Content-Security-Policy would block with a console
// error. An empty inline SVG takes its place; the footer's text and link stay.
//
//   node vendor-redoc.mjs          # after changing redoc's version in package.json
//   node vendor-redoc.mjs --check
import { readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { dirname, join } from "node:path";

const here = dirname(fileURLToPath(import.meta.url));
const from = join(here, "node_modules", "redoc");
const to = join(here, "..", "..", "internal", "httpapi", "docs");

const logo = '"https://cdn.redoc.ly/redoc/logo-mini.svg"';
const blank = '"data:image/svg+xml,%3Csvg xmlns=%22http://www.w3.org/2000/svg%22/%3E"';

function bundle() {
  const js = readFileSync(join(from, "bundles", "redoc.standalone.js"), "utf8");
  const n = js.split(logo).length - 1;
  if (n !== 1) {
    throw new Error(`expected the logo URL once in redoc.standalone.js, found it ${n} times: review the patch for this version`);
  }
  return js.replace(logo, blank);
}

const files = {
  "redoc.standalone.js": bundle(),
  "redoc.standalone.js.LICENSE.txt": readFileSync(join(from, "bundles", "redoc.standalone.js.LICENSE.txt"), "utf8"),
  "LICENSE": readFileSync(join(from, "LICENSE"), "utf8"),
};

const check = process.argv.includes("--check");
let stale = 0;
for (const [name, body] of Object.entries(files)) {
  const path = join(to, name);
  if (check) {
    let have = null;
    try { have = readFileSync(path, "utf8"); } catch {}
    if (have !== body) {
      console.error(`internal/httpapi/docs/${name} differs from redoc ${JSON.parse(readFileSync(join(from, "package.json"), "utf8")).version}: run node deploy/api/vendor-redoc.mjs`);
      stale++;
    }
  } else {
    writeFileSync(path, body);
  }
}
if (stale > 0) process.exit(1);
if (check) console.log("internal/httpapi/docs: Redoc as pinned in package-lock.json");
