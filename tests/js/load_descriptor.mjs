// Loads a JSON descriptor made by offline.core.proto.generate_proto_definitions into protobuf.js and prints a
// JSON summary on stdout, for tests/core/test_proto.py.
//
// Usage: node load_descriptor.mjs <descriptor.json> [<samples.json>] [<schema.proto>]
//
//   descriptor.json  the `json_descriptor`, loaded with protobuf.Root.fromJSON()
//   samples.json     {"objects": {MessageName: plain object}, "wire": {MessageName: base64 bytes}}
//                    every offline.*Record message is encoded from objects[name] (or {}) and decoded back;
//                    wire[name], bytes encoded by another runtime, is decoded too
//   schema.proto     optional: the proto text, parsed with protobuf.parse() and reported as parsedProto so the
//                    caller can check that the text and the JSON descriptor describe the same thing
//
// Summary: {"package", "messages": {name: {"fields": {...}, "enums": {...}}}, "records": [names],
//           "roundTrip": {name: {"encoded": base64, "decoded": object, "wireDecoded": object}},
//           "parsedProto": root JSON}
import { readFileSync } from "node:fs";
import protobuf from "protobufjs";

const PACKAGE = "offline";
const TO_OBJECT = { longs: String, enums: String, bytes: String, defaults: true, arrays: true };

function readJson(path) {
  return JSON.parse(readFileSync(path, "utf8"));
}

function describeType(type) {
  const fields = {};
  for (const field of type.fieldsArray) {
    const info = { id: field.id, type: field.type, rule: field.repeated ? "repeated" : "optional" };
    if (field.map) info.keyType = field.keyType;
    if (field.resolvedType) info.resolvedType = field.resolvedType.fullName.replace(/^\./, "");
    fields[field.name] = info;
  }
  const enums = {};
  for (const nested of type.nestedArray) {
    if (nested instanceof protobuf.Enum) enums[nested.name] = { ...nested.values };
  }
  return { fields, enums };
}

function main(argv) {
  const [descriptorPath, samplesPath, protoPath] = argv;
  if (!descriptorPath) {
    process.stderr.write("usage: node load_descriptor.mjs <descriptor.json> [<samples.json>] [<schema.proto>]\n");
    return 2;
  }
  const root = protobuf.Root.fromJSON(readJson(descriptorPath));
  root.resolveAll(); // throws on any type reference that does not resolve
  const samples = samplesPath ? readJson(samplesPath) : {};
  const objects = samples.objects ?? {};
  const wire = samples.wire ?? {};

  const pkg = root.lookup(PACKAGE);
  if (!(pkg instanceof protobuf.Namespace)) throw new Error(`package ${PACKAGE} not found`);
  const summary = { package: pkg.fullName.replace(/^\./, ""), messages: {}, records: [], roundTrip: {} };
  for (const nested of pkg.nestedArray) {
    if (nested instanceof protobuf.Type) summary.messages[nested.name] = describeType(nested);
  }

  for (const name of Object.keys(summary.messages).filter((n) => n.endsWith("Record"))) {
    const type = root.lookupType(`${PACKAGE}.${name}`);
    summary.records.push(name);
    const message = type.fromObject(objects[name] ?? {});
    const encoded = type.encode(message).finish();
    const result = {
      encoded: Buffer.from(encoded).toString("base64"),
      decoded: type.toObject(type.decode(encoded), TO_OBJECT),
    };
    if (wire[name] !== undefined) {
      result.wireDecoded = type.toObject(type.decode(Buffer.from(wire[name], "base64")), TO_OBJECT);
    }
    summary.roundTrip[name] = result;
  }

  if (protoPath) {
    summary.parsedProto = protobuf.parse(readFileSync(protoPath, "utf8"), { keepCase: true }).root.toJSON();
  }
  process.stdout.write(JSON.stringify(summary) + "\n");
  return 0;
}

process.exitCode = main(process.argv.slice(2));
