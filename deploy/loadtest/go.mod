module github.com/animal-store/petstore/deploy/loadtest

go 1.26
