/**
 * The TypeScript SDK of loam. `import loam from '@loam/sdk'` is a client
 * of the daemon named by LOAM_API_URL and LOAM_TOKEN, read when it is first
 * used; `new Loam({ url, token })` names one.
 */
import { Loam } from './client.js'

export { Loam, Sandbox, DEFAULT_URL } from './client.js'
export type { LoamOptions, ExecOptions, RunResult, AttachOptions, FileOptions, ReadOptions, Fork } from './client.js'
export { Process } from './process.js'
export type { OutputChunk, OffsetEvent, StdinSource } from './process.js'
export { EventStream, PortStream } from './streams.js'
export type { CallOptions } from './transport.js'
export * from './errors.js'
export * from './types.js'

/** The default client, from LOAM_API_URL and LOAM_TOKEN (read on first use). */
const loam: Loam = new Loam()
export default loam
