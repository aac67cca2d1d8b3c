import { test } from 'node:test'
import assert from 'node:assert/strict'
import loam, { ConflictError, ForbiddenError, InvalidError } from '@loam/sdk'
import { sandbox } from './helpers.js'

/** collect reads a stream to its end. */
async function collect(s: ReadableStream<Uint8Array>): Promise<Uint8Array> {
  const parts: Uint8Array[] = []
  const reader = s.getReader()
  for (;;) {
    const { done, value } = await reader.read()
    if (done) break
    parts.push(value)
  }
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0))
  let at = 0
  for (const p of parts) {
    out.set(p, at)
    at += p.length
  }
  return out
}

test('templates from checkpoints: create, use, export, import', async (t) => {
  const src = await sandbox(t, 'ts-tpl-src')
  await src.run(['sh', '-c', 'echo kept > /home/loam/f'])
  const cp = await src.createCheckpoint({ memory: false })
  const tpl = await loam.createTemplate('ts-tpl', { sandbox: 'ts-tpl-src', checkpoint: cp.id })
  assert.equal(tpl.kind, 'checkpoint')
  assert.equal(tpl.memory, false)
  assert.equal(tpl.state, 'ready')
  await src.deleteCheckpoint(cp.id) // the template outlives its checkpoint

  const a = await sandbox(t, 'ts-tpl-a', { template: 'ts-tpl' })
  assert.equal((await a.run(['cat', '/home/loam/f'])).stdout, 'kept\n')
  assert.equal((await loam.templates()).find((x) => x.name === 'ts-tpl')?.uses, 1)
  await assert.rejects(loam.deleteTemplate('ts-tpl'), ConflictError)
  await assert.rejects(loam.deleteTemplate('busybox'), ForbiddenError)

  const archive = await collect(await loam.exportTemplate('ts-tpl'))
  assert.ok(archive.length > 0)
  const copy = await loam.importTemplate('ts-tpl-copy', archive)
  assert.equal(copy.name, 'ts-tpl-copy')
  const b = await sandbox(t, 'ts-tpl-b', { template: 'ts-tpl-copy' })
  assert.equal((await b.run(['cat', '/home/loam/f'])).stdout, 'kept\n')

  // A damaged archive is refused and leaves nothing.
  const damaged = archive.slice()
  const mid = Math.floor(damaged.length / 2)
  damaged[mid] = (damaged[mid] ?? 0) ^ 0xff
  await assert.rejects(loam.importTemplate('ts-tpl-bad', damaged), InvalidError)
  assert.ok(!(await loam.templates()).some((x) => x.name === 'ts-tpl-bad'))

  await a.delete()
  await b.delete()
  await loam.deleteTemplate('ts-tpl')
  await loam.deleteTemplate('ts-tpl-copy')
  assert.ok(!(await loam.templates()).some((x) => x.name.startsWith('ts-tpl')))
})

test('warm pools: a fork of a pooled checkpoint takes a member', async (t) => {
  const src = await sandbox(t, 'ts-pool-src')
  await src.run(['sh', '-c', 'echo warm > /dev/shm/w'])
  const cp = await src.createCheckpoint()
  let p = await src.setPool(cp.id, 1)
  assert.equal(p.size, 1)
  assert.equal(p.from?.checkpoint, cp.id)
  for (let i = 0; i < 600 && p.ready < 1; i++) {
    await new Promise((r) => setTimeout(r, 100))
    p = await src.pool(cp.id)
  }
  assert.equal(p.ready, 1)
  const f = await src.fork(cp.id, { name: 'ts-pool-f' })
  t.after(() => f.delete())
  assert.equal((await f.run(['sh', '-c', 'echo $(hostname) $(cat /dev/shm/w)'])).stdout, 'ts-pool-f warm\n')
  assert.equal((await src.pool(cp.id)).claimed, 1)
  assert.equal((await src.setPool(cp.id, 0)).size, 0)
  assert.equal((await loam.templatePool('busybox')).size, 0)
})
