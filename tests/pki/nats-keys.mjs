// NATS nkeys and JWTs for the integration tests, made fresh at test time with the NATS authors'
// libraries (@nats-io/nkeys, @nats-io/jwt, from tests/js/node_modules). Writes into DIR:
//   user.nk, user.pub          an nkey user: its seed file (the seed line, then the public key
//                              line, as `nk -gen user -pubout` writes it) and its public key
//   stranger.nk                another nkey user's seed file, which no server knows
//   operator.conf              a nats-server config fragment for operator mode: the operator JWT,
//                              a memory resolver and the account JWT preloaded
//   user.creds                 a .creds file (user JWT and seed) of a user of that account
//   stranger.creds             a .creds file of a user signed by an account no server knows
//   node tests/pki/nats-keys.mjs DIR        (make-nats-keys.sh installs the packages first)
import { writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";

// the packages are tests/js's (package.json and package-lock.json there pin them)
const require = createRequire(new URL("../js/package.json", import.meta.url));
const { createUser } = require("@nats-io/nkeys");
const { createAccount, createOperator, encodeAccount, encodeOperator, encodeUser, fmtCreds } =
  require("@nats-io/jwt");

const dir = process.argv[2];
if (!dir) {
  console.error("usage: node nats-keys.mjs DIR");
  process.exit(2);
}
const text = (u8) => new TextDecoder().decode(u8);
const put = (name, data) => writeFileSync(join(dir, name), data, { mode: 0o600 });

// nkey users: seed, then public key
function nkeyFile(name) {
  const kp = createUser();
  put(`${name}.nk`, `${text(kp.getSeed())}\n${kp.getPublicKey()}\n`);
  return kp.getPublicKey();
}
put("user.pub", nkeyFile("user") + "\n");
nkeyFile("stranger");

// operator mode: operator -> account -> user
const operator = createOperator();
const account = createAccount();
const operatorJwt = await encodeOperator("kvr-test-operator", operator);
// limits left out are 0 to nats-server ("maximum account active connections exceeded")
const limits = { conn: -1, subs: -1, data: -1, payload: -1, imports: -1, exports: -1, leaf: -1,
  wildcards: true };
const accountJwt = await encodeAccount("KVR", account, { limits }, { signer: operator });
put(
  "operator.conf",
  [
    `operator: ${operatorJwt}`,
    "resolver: MEMORY",
    `resolver_preload: {`,
    `  ${account.getPublicKey()}: ${accountJwt}`,
    `}`,
    "",
  ].join("\n"),
);
async function creds(name, issuer) {
  const user = createUser();
  const jwt = await encodeUser(name, user, issuer);
  put(`${name}.creds`, fmtCreds(jwt, user));
}
await creds("user", account);
await creds("stranger", createAccount());
