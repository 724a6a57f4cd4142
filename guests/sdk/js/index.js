// Where the WIT package lives inside this package, for build scripts that
// run componentize-js: `componentize-js checker.js --wit "$(node -p
// "require('@portwise/guest').witDir")" ...` or, in ESM, import { witDir }.
// Build-time only (Node.js): a checker itself imports the WIT's interfaces,
// e.g. "portwise:membership/probes@0.2.1", not this module.
import { fileURLToPath } from "node:url";

/** The directory holding membership.wit (portwise:membership@0.2.1). */
export const witDir = fileURLToPath(new URL("./wit", import.meta.url));
/** The WIT package this version carries. */
export const witPackage = "portwise:membership@0.2.1";
/** The world a checker implements. */
export const world = "membership-checker";
