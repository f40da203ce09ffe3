
,
aPlaceholder*
dtype0*
shape:
,
bPlaceholder*
dtype0*
shape:

cAddV2ab*
T0"µ	