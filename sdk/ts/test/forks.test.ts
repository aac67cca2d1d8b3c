// Many forks at once (Loam.forkMany), against a real daemon.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import loam, { ConflictError, InvalidError, NotFoundError } from '@loam/sdk'
import { sandbox } from './helpers.js'

test('forkMany: forks of a memory checkpoint in order, a name taken, a bad source', async (t) => {
  const src = await sandbox(t, 'ts-many')
  await src.run(['sh', '-c', 'echo warm > /dev/shm/w'])
  const cp = await src.createCheckpoint()
  await sandbox(t, 'ts-many-2')

  const forks = await src.forkMany(cp.id, { name: 'ts-many', count: 3, labels: { suite: 'ts' } })
  t.after(async () => {
    for (const f of forks) await f.sandbox?.delete()
  })
  assert.deepEqual(
    forks.map((f) => f.name),
    ['ts-many-1', 'ts-many-2', 'ts-many-3'],
  )
  const [one, two, three] = forks
  assert.ok(one && two && three)
  assert.ok(two.error instanceof ConflictError, `ts-many-2: ${two.error}`)
  assert.equal(two.sandbox, undefined)
  for (const f of [one, three]) {
    assert.equal(f.error, undefined)
    assert.equal(f.sandbox?.created?.name, f.name)
    assert.deepEqual(f.sandbox?.created?.labels, { suite: 'ts' })
    assert.equal((await f.sandbox!.run(['cat', '/dev/shm/w'])).stdout, 'warm\n')
  }

  // None made: the first one's error.
  await assert.rejects(loam.forkMany('ts-many', 'v99', { count: 2 }), NotFoundError)
  await assert.rejects(loam.forkMany('ts-many', cp.id, { count: 65 }), InvalidError)
})
