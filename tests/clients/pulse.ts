// A TypeScript agent of Pulse, as tests/test_generated_clients.py runs it: its types are
// what openapi-typescript made of a running `pulse up`'s /openapi.json (./schema.d.ts),
// its calls openapi-fetch's; tsc checks it against them. Usage: node build/pulse.js URL
// (the token in $PULSE_TOKEN). Prints what it saw as one JSON object.
import createClient from "openapi-fetch";
import type { components, paths } from "./schema.js";

type ErrorBody = components["schemas"]["ErrorBody"];
type Hit = components["schemas"]["ScoredExperience"];

const [url] = process.argv.slice(2);
const pulse = createClient<paths, "application/json">({
  baseUrl: url,
  headers: { Authorization: `Bearer ${process.env.PULSE_TOKEN}` },
});

function answered<T>(what: string, result: { data?: T; error?: ErrorBody }): T {
  if (result.data === undefined) {
    throw new Error(`${what}: ${JSON.stringify(result.error)}`);
  }
  return result.data;
}

const notes = [
  "Retry NATS publishes with the same message id after a timeout",
  "NATS publish timeouts came from slow fsync on the server",
  "DuckDB allows one writer process per database file",
];
const collective_id: string = answered(
  "create_collective",
  await pulse.POST("/v1/create_collective", {
    body: { owner_id: "ts", name: "team", embedder: "hash" },
  }),
);
const recorded: string[] = [];
for (const content of notes) {
  recorded.push(
    answered(
      "record_experience",
      await pulse.POST("/v1/record_experience", {
        body: { collective_id, content, domain: ["ops"] },
      }),
    ),
  );
}
const ids = (hits: Hit[]): string[] => hits.map((hit) => hit.experience.experience_id);
const similar = answered(
  "search_similar",
  await pulse.POST("/v1/search_similar", { body: { collective_id, query: "NATS", k: 3 } }),
);
const text = answered(
  "search_text",
  await pulse.POST("/v1/search_text", { body: { collective_id, text: "NATS", k: 3 } }),
);
const hybrid = answered(
  "search_hybrid",
  await pulse.POST("/v1/search_hybrid", { body: { collective_id, text: "NATS", k: 3 } }),
);
const read = answered(
  "get_experience",
  await pulse.POST("/v1/get_experience", { body: { experience_id: recorded[0] } }),
);
const table = answered(
  "sql",
  await pulse.POST("/v1/sql", {
    body: {
      query: `SELECT content FROM experiences WHERE collective_id = '${collective_id}' AND contains(content, 'DB')`,
    },
  }),
);
const missing = await pulse.POST("/v1/get_experience", {
  body: { experience_id: "01900000-0000-7000-8000-000000000000" },
});
const refused = await pulse.POST("/v1/sql", { body: { query: "DELETE FROM experiences" } });
const failure = (result: { error?: ErrorBody; response: Response }) => ({
  status: result.response.status,
  error: result.error?.error,
  message: result.error?.message,
});
console.log(
  JSON.stringify({
    notes,
    recorded,
    similar: ids(similar),
    text: ids(text),
    hybrid: ids(hybrid),
    read: { experience_id: read.experience_id, content: read.content },
    sql: { columns: table.columns, rows: table.rows },
    missing: failure(missing),
    refused: failure(refused),
  }),
);
