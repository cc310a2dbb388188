#!/usr/bin/env node
// Makes signing keys and signs JWTs for the Worker's JWT tests (node:crypto, no packages).
//
// stdin:  {"keys": [{"alg": "RS256" | "ES256"}, ...],
//          "tokens": [{"key": 0, "header": {...}, "payload": {...}}, ...]}
// stdout: {"jwks": [public JWK of each key], "tokens": ["header.payload.signature", ...]}
// Each token is signed with keys[key] as its header's alg says: RS256 (PKCS#1 v1.5) or
// ES256 (the raw r||s form JWS uses). The header is written exactly as given, so a test
// can write a wrong alg or kid.
import { generateKeyPairSync, sign } from "node:crypto";

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return Buffer.concat(chunks).toString("utf8");
}

const job = JSON.parse(await readStdin());
const pairs = job.keys.map(({ alg }) =>
  alg === "RS256"
    ? generateKeyPairSync("rsa", { modulusLength: 2048 })
    : generateKeyPairSync("ec", { namedCurve: "P-256" }),
);
const jwks = pairs.map(({ publicKey }) => publicKey.export({ format: "jwk" }));
const part = (value) => Buffer.from(JSON.stringify(value)).toString("base64url");
const tokens = job.tokens.map(({ key, header, payload }) => {
  const input = `${part(header)}.${part(payload)}`;
  const { privateKey } = pairs[key];
  const signature =
    job.keys[key].alg === "RS256"
      ? sign("sha256", Buffer.from(input), privateKey)
      : sign("sha256", Buffer.from(input), { key: privateKey, dsaEncoding: "ieee-p1363" });
  return `${input}.${signature.toString("base64url")}`;
});
process.stdout.write(JSON.stringify({ jwks, tokens }) + "\n");
