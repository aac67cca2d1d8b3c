// The seed's TypeScript lines (loam's checkpoint documentation), verbatim,
// against a real daemon through the default client (LOAM_API_URL, LOAM_TOKEN).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import loam, { NotFoundError } from '@loam/sdk'

test('the seed: checkpoint, restore, fork, delete', async (t) => {
  await loam.create({ name: 'scratch' })
  t.after(async () => {
    await loam.delete('scratch-2').catch(() => undefined)
    await loam.delete('scratch')
  })

  const box = loam.sandbox('scratch')
  const cp = await box.createCheckpoint({ comment: 'before upgrade' })   // memory: true by default
  await box.restoreCheckpoint(cp.id)
  await loam.fork('scratch', cp.id, { name: 'scratch-2', labels: { owner: 'docs' } })
  await box.deleteCheckpoint(cp.id)

  assert.equal(cp.comment, 'before upgrade')
  assert.equal(cp.memory, true)
  const fork = await loam.get('scratch-2')
  assert.equal(fork.state, 'running')
  assert.deepEqual(fork.labels, { owner: 'docs' })
  assert.deepEqual(fork.from, { sandbox: 'scratch', checkpoint: cp.id })
  await assert.rejects(box.getCheckpoint(cp.id), NotFoundError)
  const left = await box.checkpoints()
  assert.deepEqual(left.map((c) => [c.auto, c.comment]), [[true, `before restoring ${cp.id}`]])
})
