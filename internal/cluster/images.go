package cluster

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/image"
	"loam.dev/loam/internal/store"
)

// Images are pulled by the node a POST /v1/images reaches, and again by
// any node that makes a sandbox of one and lacks its layers; their records
// are the cluster's. A node reports the images it has unpacked with its
// lease (api.NodeLoad.Images): the names of the trees in its cache,
// "image-<digest's first 16 hex>-<recipe's hash>", which begin with the
// record's Template (isCache).

// placeImage is the node a create of image ref (as the create gives it)
// of org goes to, and why.
//
// An image from a registry may be made anywhere: the node with the most
// memory free after it, one that has the image unpacked winning a near
// tie, as a built-in template does. A stronger preference would pile
// every sandbox of a popular image onto the first node that pulled it
// until that node is full, while a miss costs one pull per node, once:
// after it that node has the image too. Memory is what bounds how many
// sandboxes a node holds, so it comes first.
//
// An image from a path on a host (an OCI layout or a `docker save`
// tarball) can be pulled only where that path is: a sandbox of it is made
// on a node that has it unpacked (the one that pulled it), and nowhere
// else; limit or unavailable when none of them can take it. When none has
// it unpacked yet, this node makes it if the path is on its host; else a
// pull still under way (on another node, whose host has the path) is a
// conflict, as it is on one machine; else the best node tries its own host.
func (rt *Router) placeImage(ctx context.Context, org, ref string, nodes []*store.Node, now time.Time, a ask) (string, string, error) {
	ref, err := image.Canonical(ref)
	if err != nil {
		return rt.member.Name(), "the image is no reference (this node answers why)", nil
	}
	im, err := rt.recs.GetImage(ctx, org, image.ID(ref))
	if err != nil {
		if !errors.Is(err, store.ErrNotFound) {
			rt.log.Warn("placing a sandbox without its image's record", "image", ref, "err", err)
		}
		im = nil // not pulled yet: the node the sandbox goes to pulls it
	}
	pref := imageCached(ref, im)
	if !filepath.IsAbs(ref) {
		return best(nodes, now, a, pref, rt.placed.recent(nodes))
	}
	var held []*store.Node
	if pref.has != nil {
		for _, n := range nodes {
			if pref.has(n) {
				held = append(held, n)
			}
		}
	}
	if len(held) > 0 {
		node, code, why := within(held, now, a, rt.placed.recent(held))
		if node == "" {
			return "", "", api.Errorf(code, "no node can take a sandbox of image %s (%s): it is on %s; an image from a path on a host is pulled where the path is, and its sandboxes are made there",
				ref, a, why)
		}
		return node, "has image " + ref + " cached, from a path on its host", nil
	}
	if _, err := os.Stat(ref); err == nil && rt.runsSandboxes() {
		return rt.member.Name(), "image " + ref + " is a path on this node's host", nil
	}
	if im != nil && im.State == api.ImagePulling {
		return "", "", api.Errorf(api.CodeConflict, "image: %s is still being pulled, on a node whose host has the path; its sandboxes are made there once it is ready", ref)
	}
	return best(nodes, now, a, cachePref{}, rt.placed.recent(nodes))
}

// imageCached prefers the nodes that have image ref, of record im,
// unpacked; none while im is nil or not yet unpacked anywhere (its
// Template is set once it is).
func imageCached(ref string, im *store.Image) cachePref {
	if im == nil || im.Template == "" {
		return cachePref{}
	}
	return cachePref{what: "image " + ref, has: func(n *store.Node) bool {
		return slices.ContainsFunc(n.Load.Images, func(e string) bool { return isCache(e, im.Template) })
	}}
}

// runsSandboxes reports whether this node runs sandboxes (not a front end,
// --role api), as its last lease said.
func (rt *Router) runsSandboxes() bool {
	n := rt.member.Node(rt.member.Name())
	return n == nil || n.Load.Role == RoleNode
}
