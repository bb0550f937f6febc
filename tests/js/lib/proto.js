// The wire messages, from proto/kvrouter/v1/kvrouter.proto loaded at run time (no generated code).
import path from "node:path";
import { fileURLToPath } from "node:url";
import protobuf from "protobufjs";

const here = path.dirname(fileURLToPath(import.meta.url));
export const PROTO = process.env.KVR_PROTO ||
  path.resolve(here, "../../../proto/kvrouter/v1/kvrouter.proto");

// keepCase: the proto's own snake_case field names, as on every other client.
const root = new protobuf.Root().loadSync(PROTO, { keepCase: true });
root.resolveAll();

export const pb = {
  root,
  type: (name) => root.lookupType(`kvrouter.v1.${name}`),
};

// ErrorCode name -> number, and back, from the proto's enum.
export const ErrorCode = root.lookupEnum("kvrouter.v1.ErrorCode").values;
export const codeName = (n) => root.lookupEnum("kvrouter.v1.ErrorCode").valuesById[n] ?? `code ${n}`;

// Encode a plain object (snake_case field names, as in the proto) as message `type`.
export function encode(type, obj) {
  const T = pb.type(type);
  checkKeys(T, obj, type);
  return T.encode(T.fromObject(obj)).finish();
}

// Every key of obj is a field of T (fromObject would drop a misspelt one silently).
function checkKeys(T, obj, where) {
  for (const [k, v] of Object.entries(obj)) {
    const f = T.fields[k];
    if (!f) throw new Error(`the test itself: ${where} has no field ${k}`);
    if (f.resolvedType && f.resolvedType.fields && v && typeof v === "object" && !f.repeated)
      checkKeys(f.resolvedType, v, `${where}.${k}`);
  }
}

// Decode bytes as message `type` into a plain object: every field present (defaults), 64-bit
// integers as decimal strings, enums as numbers.
export function decode(type, bytes) {
  const T = pb.type(type);
  return T.toObject(T.decode(bytes), { longs: String, enums: Number, defaults: true, arrays: true });
}

// Append an unknown length-delimited field (number `field`) of `len` bytes to an encoded message:
// still a valid message of the same type, `len` bytes longer.
export function withUnknownField(bytes, field, len) {
  const w = protobuf.Writer.create();
  w.uint32((field << 3) | 2).bytes(new Uint8Array(len));
  const tail = w.finish();
  const out = new Uint8Array(bytes.length + tail.length);
  out.set(bytes, 0);
  out.set(tail, bytes.length);
  return out;
}
