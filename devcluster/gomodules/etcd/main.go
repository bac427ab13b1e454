// Command etcd is etcd's server, built from its published module by `phalanx dev install`
// (devcluster/gobuild.py): the same entry point as etcd's own main package.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
