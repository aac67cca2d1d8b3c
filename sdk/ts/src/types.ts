// Wire types of the loam API, under the SDK's names. Their shapes are not
// written here: they are the schemas of the API's OpenAPI document
// (api/openapi.yaml, which the daemon serves at GET /v1/openapi.yaml),
// generated into ./generated/openapi.ts by scripts/generate.mjs at build
// time. The Go types (package loam.dev/loam/api) are held to the same
// document by the end-to-end conformance test (test/openapi_test.go), so the
// three cannot drift apart. Times are RFC 3339 strings.
//
// Each object type is an interface extending its schema, not a type alias:
// that keeps the names users see in their editors and errors, and lets them
// extend or merge the types as before. Documentation of each field is the
// document's own (see the generated file).
import type { components } from './generated/openapi.js'

/** The schemas of the API's OpenAPI document, by name. */
type Schemas = components['schemas']
/** One schema; a generic alias, since an interface may only extend a name. */
type Schema<K extends keyof Schemas> = Schemas[K]

/** A sandbox's state (schema State). */
export type State = Schemas['State']

/** The limits a sandbox runs under (schema Resources). */
export interface Resources extends Schema<'Resources'> {}

/**
 * The settings of a sandbox that may change while it lives (PATCH
 * /v1/sandboxes/{sandbox}); what is left out stays. labels replaces every
 * label (schema UpdateSandbox).
 */
export interface UpdateSandbox extends Schema<'UpdateSandbox'> {}

/** What a sandbox may reach on the network; enforced on the host (schema NetworkPolicy). */
export interface NetworkPolicy extends Schema<'NetworkPolicy'> {}

/** The checkpoint a fork was made from (schema ForkSource). */
export interface ForkSource extends Schema<'ForkSource'> {}

/** A sandbox as the API shows it (schema Sandbox). */
export interface SandboxInfo extends Schema<'Sandbox'> {}

/** A sandbox's use of its disk against resources.disk_mib (schema DiskUse). */
export interface DiskUse extends Schema<'DiskUse'> {}

/** What a running sandbox uses of the host now, read from its cgroup (schema Usage). */
export interface Usage extends Schema<'Usage'> {}

/** A supervised command of a sandbox (schema Service). */
export interface Service extends Schema<'Service'> {}

/** The body of a create (POST /v1/sandboxes). Every field is optional (schema CreateSandbox). */
export interface CreateSandbox extends Schema<'CreateSandbox'> {}

/** What a fork may give: all of a create but the template, image and resources, which come from the checkpoint. */
export type ForkOptions = Omit<CreateSandbox, 'from' | 'template' | 'image' | 'resources' | 'services' | 'count'>

/** What forkMany takes: a fork's options and how many forks to make, 1 to 64 (MAX_FORK_COUNT). */
export type ForkManyOptions = ForkOptions & { count: number }

/** The answer of a create with a count: every fork, in order (schema ForkList). */
export interface ForkList extends Schema<'ForkList'> {}

/** One fork of a ForkList: its name, and its sandbox or its error (schema ForkResult). */
export interface ForkResult extends Schema<'ForkResult'> {}

/** The most forks one create makes (api.MaxForkCount). */
export const MAX_FORK_COUNT = 64

/** A root filesystem sandboxes are made from (schema Template). */
export interface Template extends Schema<'Template'> {}

/** An OCI image the daemon pulled, or is pulling (schema Image). */
export interface Image extends Schema<'Image'> {}

/** What an image's config gives its sandboxes (schema ImageConfig). */
export interface ImageConfig extends Schema<'ImageConfig'> {}

/** A registry the daemon holds credentials for, never the password (schema Registry). */
export interface Registry extends Schema<'Registry'> {}

/** The token that opens a private sandbox's URL, and the URL (schema AccessToken). */
export interface AccessToken extends Schema<'AccessToken'> {}

/** A checkpoint as the API shows it (schema Checkpoint). */
export interface Checkpoint extends Schema<'Checkpoint'> {}

/** The body of a checkpoint create; memory is true when left out (schema CreateCheckpoint). */
export interface CreateCheckpoint extends Schema<'CreateCheckpoint'> {}

/** An exec session (schema Session). */
export interface Session extends Schema<'Session'> {}

/** A service as the API shows it: its definition and how it is doing (schema ServiceStatus). */
export interface ServiceStatus extends Schema<'ServiceStatus'> {}

/** A file of a sandbox, as lstat sees it (schema FileInfo). */
export interface FileInfo extends Schema<'FileInfo'> {}

/** One event of a file watch (schema WatchEvent). */
export interface WatchEvent extends Schema<'WatchEvent'> {}

/** A TCP port something in a sandbox listens on (schema Port). */
export interface Port extends Schema<'Port'> {}

/** One event of a port watch (schema PortEvent). */
export interface PortEvent extends Schema<'PortEvent'> {}

/** A secret: its name and times, never its value (schema Secret). */
export interface Secret extends Schema<'Secret'> {}

/** The first message of an exec socket, and the body of a session start (schema ExecRequest). */
export interface ExecRequest extends Schema<'ExecRequest'> {}

/**
 * One object of both ways' messages: every type, and every other field
 * optional. The document has one schema for each way; the SDK has always
 * read and written them as one type.
 */
type Either<A extends { type: string }, B extends { type: string }> = { type: A['type'] | B['type'] } & Partial<
  Omit<A, 'type'>
> &
  Partial<Omit<B, 'type'>>

/**
 * A text message of an exec or attach socket, either way: from the client
 * (schema ExecClientControl) or from the server (schema ExecServerControl).
 */
export interface ExecControl extends Either<Schema<'ExecClientControl'>, Schema<'ExecServerControl'>> {}

/**
 * A warm pool: sandboxes kept made ahead of time from a checkpoint (from) or
 * a template, for forks and creates to claim (schema Pool).
 */
export interface Pool extends Schema<'Pool'> {}

/** The largest message on a port stream, either way (api.MaxPortMessage). */
export const MAX_PORT_MESSAGE = 256 << 10

/** The subprotocol the server picks (api.WebSocketProtocol). */
export const WEBSOCKET_PROTOCOL = 'loam.v1'
/** The prefix of the subprotocol that carries the token (api.WebSocketTokenPrefix). */
export const WEBSOCKET_TOKEN_PREFIX = 'loam.token.'

/** What an org may use at most; a field left out is unlimited (schema Quota). */
export interface Quota extends Schema<'Quota'> {}

/** What an org uses now, in the fields of Quota (schema OrgUse). */
export interface OrgUse extends Schema<'OrgUse'> {}

/** An org with its quota and use (schema Org). */
export interface Org extends Schema<'Org'> {}

/** What an API key may do in its org: read, write or admin (schema Scope). */
export type Scope = Schemas['Scope']

/** The body of POST /v1/keys; all but name optional (schema CreateKey). */
export interface CreateKey extends Schema<'CreateKey'> {}

/** An API key; secret only in the answer that made it (schema Key). */
export interface Key extends Schema<'Key'> {}

/** One record of the audit log (schema AuditEvent). */
export interface AuditEvent extends Schema<'AuditEvent'> {}
