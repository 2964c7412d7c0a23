module github.com/animal-store/petstore/deploy/soak

go 1.26
